"""Where a job's processes run and what the cluster can give: learners as Ray actors or in this
process (`runtime.py`), slots and placement groups (`capacity.py`), the cluster's nodes,
accelerators and autoscaler (`resources.py`), and a real Ray head of its own for tests and
benchmarks (`local_head.py`).
"""
