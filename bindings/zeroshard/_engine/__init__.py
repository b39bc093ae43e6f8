"""The engine's Python half, over the C++ Engine (zeroshard._zeroshard): ZeroShardEngine
(engine) wraps an nn.Module, its stage-3 units (units, touch, unit_backward), the optimizer
the user gave or the config named (optimizer, torch_optimizer, adafactor), zeroshard.init's
construction (construction), saving and loading (saving), generate (generation), the data
loader (dataloader), the pipeline engine (pipe_engine) and initialize() that picks between
them (initialize).
May import: _common, _checkpoint, _activations, _parallel and the C++ extension."""
