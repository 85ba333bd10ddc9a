"""The learner: one model replica on one device (`replica.py`), what it offers its driver and group
as a Ray actor (`service.py`), where it is in its data (`data_cursor.py`), how it fits a batch in
device memory (`memory_fit.py`), and the faults tests make it simulate (`faults.py`)."""
