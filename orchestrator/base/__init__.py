"""Helpers every layer of the orchestrator may import, which import none of it: strict JSON
(`strict_json.py`) and the flat tensors a learner trains in and sends (`flat.py`).
"""
