"""Speech corpora made on this machine for tests, demos and benchmarks (`chorus synth`): offline
multi-voice, multi-engine speech of a command or an open-vocabulary task (`corpus`), real English
sentences for the latter (`open_text`), and voices converted by the WORLD vocoder
(`voice_conversion`). Nothing in training imports it."""
