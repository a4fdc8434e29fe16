import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the source tree's ibvbridge, even when not installed
sys.path.insert(0, HERE)

import pytest  # noqa: E402

from fake_producer import FakeProducer  # noqa: E402
from ibvbridge import Producer  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _own_ring_dir(tmp_path_factory):
    """Every test (and every recv, C or Go tool it starts) looks up and creates rings in a directory of the
    session's own: nothing lands in the machine-wide /run/ibvbridge or /dev/shm/ibvbridge-UID."""
    d = tmp_path_factory.mktemp("rings")
    os.chmod(d, 0o755)
    old = os.environ.get("IBVBRIDGE_RING_DIR")
    os.environ["IBVBRIDGE_RING_DIR"] = str(d)
    yield
    if old is None:
        os.environ.pop("IBVBRIDGE_RING_DIR", None)
    else:
        os.environ["IBVBRIDGE_RING_DIR"] = old


@pytest.fixture
def make_producer(tmp_path):
    made = []

    def make(name="r", **kw):
        p = FakeProducer(str(tmp_path), name, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        if not p.closed:
            p.close()


@pytest.fixture
def make_public_producer(tmp_path):
    """Producer.create in tmp_path, small by default (8 slots of 256 bytes), closed after the test."""
    made = []

    def mk(name="r", **kw):
        kw.setdefault("directory", str(tmp_path))
        kw.setdefault("hugepages", "off")
        kw.setdefault("slot_count", 8)
        kw.setdefault("slot_size", 256)
        kw.setdefault("max_items", 4)
        kw.setdefault("meta_size", 4096)
        p = Producer.create(name, **kw)
        made.append(p)
        return p

    yield mk
    for p in made:
        p.close()
