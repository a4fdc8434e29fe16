"""The public API is typed (PEP 561): every public function and method of the package's API has annotated
parameters and return, the annotations resolve, and ``pip install`` (offline) ships ``py.typed``."""

import inspect
import os
import shutil
import subprocess
import sys
import typing


from ibvbridge import layout, producer, ring, shared

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)

PUBLIC_CLASSES = [ring.Ring, ring.Heap, ring.Batch, ring.Item, producer.Producer, producer.Slot]
PUBLIC_FUNCTIONS = [ring.socket_path_for, ring.lookup_dirs, ring.default_dir, ring.uid_trusted,
                    ring.validate_geometry, producer.producer_dir, producer.layout_for, producer.meta_record,
                    layout.pack_hello, layout.unpack_hello, layout.pack_welcome, layout.pack_error,
                    layout.unpack_record, layout.ctl_size_for] + [
    getattr(shared, n) for n in ("valid_name", "own_default_dir", "own_default_dirs", "producer_dirs", "default_dir", "lookup_dirs", "open_trusted_dir",
                                 "peer_trusted", "make_dir_nofollow", "row_word")]


def public_callables():
    for f in PUBLIC_FUNCTIONS:
        yield f.__qualname__, f
    for cls in PUBLIC_CLASSES:
        for name, attr in vars(cls).items():
            if name.startswith("_") and name not in ("__enter__", "__exit__"):
                continue
            if isinstance(attr, property):
                yield f"{cls.__name__}.{name}", attr.fget
            elif isinstance(attr, (classmethod, staticmethod)):
                yield f"{cls.__name__}.{name}", attr.__func__
            elif inspect.isfunction(attr):
                yield f"{cls.__name__}.{name}", attr


def test_public_api_is_fully_annotated_and_resolves():
    missing = []
    for qual, f in public_callables():
        sig = inspect.signature(f)
        params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
        if sig.return_annotation is inspect.Signature.empty or any(
                p.annotation is inspect.Parameter.empty for p in params):
            missing.append(qual)
            continue
        typing.get_type_hints(f)  # every annotation names something real
    assert missing == []
    assert "Heap.valid" in dict(public_callables()) and "Ring.release" in dict(public_callables())


def test_pip_install_ships_py_typed(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", ".pytest_cache"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", str(tmp_path / "site"), str(src)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "ibvbridge" / "py.typed").is_file()
    assert (tmp_path / "site" / "ibvbridge" / "shared.py").is_file()
