import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the source tree's ibvbridge, even when not installed
sys.path.insert(0, HERE)

import pytest  # noqa: E402

from fake_producer import FakeProducer  # noqa: E402


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
