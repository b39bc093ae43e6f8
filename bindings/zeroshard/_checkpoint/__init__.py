"""Files from and for other programs: DeepSpeed's checkpoints read and written in its layout
(deepspeed_checkpoint, deepspeed_files), a sharded checkpoint consolidated into one state
dict (consolidate, also the zeroshard-consolidate command), and pickled files read without
running their code (safe_load).
May import: _common and the C++ extension."""
