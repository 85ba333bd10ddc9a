"""What a run keeps: one evaluation-and-checkpoint in flight (`snapshot.py`, the learners' model sum
from `consensus.py`), the checkpoint's manifest (`job_checkpoint.py`) and file format
(`files.py`), the learners' and evaluator's state files (`state_store.py`), the run's outputs at a
URI (`storage.py`) and the run folder's lock (`rundir.py`).
"""
