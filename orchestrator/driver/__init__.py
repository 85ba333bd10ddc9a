"""The job's driver: the spec (`config.py`), the job that wires the parts (`job.py`), the training
loop (`loop.py`), membership (`roster.py`, `elastic.py`), the group's forming and re-forming
(`group.py`), the policies the loop consults (`watchdog.py`, `rollback.py`), recovery timings
(`recovery.py`), events (`events.py`), metrics (`metrics.py`) and the run's summary
(`summary.py`).
"""
