"""Errors tvm-nimble raises: one line naming the problem and what to do about it."""


class NimbleError(Exception):
    """Base class of every error tvm-nimble raises on purpose."""


class ModelError(NimbleError):
    """The model file or graph cannot be used."""


class ShapeError(NimbleError):
    """Shapes are dynamic, symbolic or do not match."""


class UnsupportedOperatorError(ModelError):
    """The model uses operators the TVM ONNX importer cannot convert."""


class TrainingDivergedError(NimbleError):
    """A training step's loss is inf or nan: the weights have left the finite range."""


class ArtifactError(NimbleError):
    """An artifact is missing, corrupted or built for something else."""
