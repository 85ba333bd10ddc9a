"""What `chorus export` copies into an export's folder beside the model: `transcribe.py`, a script
that needs torch and soundfile but not Chorus."""
