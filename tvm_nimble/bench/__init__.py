"""Benchmarks: the systems compared (Nimble, stock TVM, PyTorch, torch.compile, TensorRT), timing,
and the results CSV / RESULTS.md report.

Rule: outside the library core. It imports the compiler and the runtime; neither imports it.
"""
