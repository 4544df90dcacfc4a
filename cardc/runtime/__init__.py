"""Training and sampling runtime for compiled cardc models.

Independent of the compiler: every entry point takes an already-built
``torch.nn.Module``. Submodules are imported on demand so that importing this
package stays cheap.
"""
