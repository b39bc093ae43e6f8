"""The commands: the `zeroshard` launcher (launcher, hostfile: DeepSpeed's launcher and
hostfile format), zeroshard-estimate (estimate, cli).
May import: _common, _checkpoint, _activations, _parallel, _engine and the C++ extension."""
