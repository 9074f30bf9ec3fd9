"""Test-session settings.

Tests run torch with one intra-op thread: the models here are tiny (one thread is as fast), and
on a busy 2-core CI machine a second thread can be starved. Bitwise determinism of CPU training
is also only promised for a fixed thread count (see ``dynascope.train``); with more than one
thread some CPU kernels were measured to differ run to run (docs/benchmarks.md).
"""

import torch

torch.set_num_threads(1)
