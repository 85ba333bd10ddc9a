"""The job's service process beside its driver (`job_service.py`): the shard planner the learners ask
for their data every epoch (`shards.py`) and the evaluator that scores the group's averaged model
(`evaluator.py`).
"""
