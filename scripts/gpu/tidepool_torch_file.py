"""tidepool.torch loaded from this checkout by path, so that no tidepool
extension module needs to be built or installed: how the GPU check's
PyTorch scripts reach libtidepool_torch.so."""
import importlib.util
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python", "tidepool",
                    "torch.py")


def load():
    """The module bindings/python/tidepool/torch.py, as tidepool_torch."""
    spec = importlib.util.spec_from_file_location("tidepool_torch", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
