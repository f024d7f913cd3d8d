"""An example script (``examples/<name>.py``) loaded as a module, for the tests that call
its ``main(argv)`` in-process (the examples are scripts, not a package)."""
import importlib.util
import pathlib
from types import ModuleType

#: the repository's examples folder
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` executed as a fresh module called ``name``."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"no example {name!r}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
