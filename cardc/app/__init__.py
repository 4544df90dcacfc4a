"""The application: what `cardc train` and `cardc sample` do, as Python functions.

A layer above both the compiler (it checks cards and builds their models) and the runtime
(which trains and samples an already-built module and knows nothing of cards): it chooses the
training or inference card, the tokenizer and the hyperparameters, and binds them together.
The command line (`cardc.cli`) is a thin layer over it; `cardc.train` and `cardc.sample` are
its entry points. Submodules are imported on demand: `training` and `sampling` import torch.
"""
