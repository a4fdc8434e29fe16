#!/usr/bin/python3
"""Every public type of the C headers (struct/enum ibvb_*, not the internal ibvb__*) is named in
clients/c/README.md: a type added without a word for its users fails make test."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
C = os.path.join(ROOT, "clients", "c")
types = set()
for h in sorted(os.listdir(C)):
    if h.endswith(".h") and h != "ibvbridge_internal.h":
        types |= set(re.findall(r"^(?:struct|enum) (ibvb_[a-z0-9_]+)\s*[{;]", open(os.path.join(C, h)).read(), re.M))
readme = open(os.path.join(C, "README.md")).read()
types = {t for t in types if not t.startswith("ibvb__")}
missing = sorted(t for t in types if not re.search(rf"\b{t}\b", readme))
for t in missing:
    print(f"clients/c/README.md does not name the public type {t}")
print(f"C public types: {len(types) - len(missing)} passed, {len(missing)} failed")
sys.exit(1 if missing else 0)
