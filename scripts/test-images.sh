#!/usr/bin/env bash
# The container images (make test-images, part of make test): built twice from the same packages, both
# images get the same digests; each image's layout, layers, entrypoint, user and labels are checked from
# its OCI files; then podman (with its storage in a temporary directory) loads both and, where it can run
# containers here, runs recv in one container and a Python consumer in another, sharing only a volume for
# the ring directory, and the consumer reads every heap of a stream sent to recv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
say() { printf 'test-images: %s\n' "$*"; }
fail() { say "FAIL: $*" >&2; exit 1; }
passed=0
ok() { passed=$((passed + 1)); say "ok: $*"; }

work=$(mktemp -d)
pod=() # podman with its storage in $work
cleanup() {
  local rc=$?
  if ((${#pod[@]})); then
    "${pod[@]}" rm -af -t 0 >/dev/null 2>&1 || true
    "${pod[@]}" volume rm -af >/dev/null 2>&1 || true
    "${pod[@]}" rmi -af >/dev/null 2>&1 || true
    umount -R "$work/storage" 2>/dev/null || true
  fi
  rm -rf "/tmp/ibvbridge-oci-$$"
  rm -rf "$work" 2>/dev/null || { sleep 1; rm -rf "$work"; }
  exit $rc
}
trap cleanup EXIT

# Both builds from the same commit's date and name, whatever is committed while they run.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)} REVISION=${REVISION:-$(git rev-parse HEAD)}
t0=$SECONDS
OUT=$work/a scripts/build-images.sh >"$work/build-a.log" 2>&1 || { cat "$work/build-a.log" >&2; fail "make images"; }
sed 's/^/  /' "$work/build-a.log"
t1=$SECONDS
OUT=$work/b scripts/build-images.sh >"$work/build-b.log" 2>&1 || { cat "$work/build-b.log" >&2; fail "make images (second build)"; }
cmp -s "$work/a/digests.json" "$work/b/digests.json" || fail "two builds differ: $(cat "$work/a/digests.json") vs $(cat "$work/b/digests.json")"
ok "two builds from the same packages: the same digests ($((t1 - t0)) s and $((SECONDS - t1)) s)"

# Inspect the layouts as a registry or podman would read them.
$PY - "$work/a" <<'PYEOF' || fail "image layout checks"
import hashlib, json, os, sys, tarfile, io, gzip
root = sys.argv[1]
def blob(lay, d):
    p = os.path.join(lay, "blobs", *d.split(":"))
    b = open(p, "rb").read()
    assert "sha256:" + hashlib.sha256(b).hexdigest() == d, f"{p}: content does not match its digest"
    return b
want = {"recv": ("/usr/bin/ibvbridge", ["usr/bin/ibvbridge", "lib64/ld-linux-x86-64.so.2", "usr/lib/x86_64-linux-gnu/libibverbs.so.1"]),
        "python": ("/usr/bin/python3", ["usr/bin/python3", "usr/lib/python3/dist-packages/ibvbridge/ring.py",
                                        "usr/lib/python3/dist-packages/numpy/__init__.py"])}
for name, (entry, files) in want.items():
    lay = os.path.join(root, name)
    assert json.load(open(os.path.join(lay, "oci-layout")))["imageLayoutVersion"] == "1.0.0"
    idx = json.load(open(os.path.join(lay, "index.json")))
    (m,) = idx["manifests"]
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json", m["mediaType"]
    man = json.loads(blob(lay, m["digest"]))
    cfg = json.loads(blob(lay, man["config"]["digest"]))
    c = cfg["config"]
    assert c["Entrypoint"] == [entry], c["Entrypoint"]
    assert c["User"] == "65532:65532", c["User"]
    assert "io.ibvbridge.capabilities" in c["Labels"], c["Labels"]
    assert cfg["created"] == cfg["history"][0]["created"], "created dates differ"
    assert len(man["layers"]) == 3 and len(cfg["rootfs"]["diff_ids"]) == 3, man["layers"]
    names, owners, shells = set(), {}, []
    for l in man["layers"]:
        assert l["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip", l["mediaType"]
        with tarfile.open(fileobj=io.BytesIO(blob(lay, l["digest"])), mode="r:gz") as t:
            prev = None
            for ti in t:
                assert prev is None or ti.name > prev, f"{name}: {ti.name} after {prev}: not in byte order"
                prev = ti.name
                assert ti.uname == "" and ti.gname == "", f"{ti.name}: user or group names"
                assert ti.mtime == int(os.environ.get("SOURCE_DATE_EPOCH") or ti.mtime), ti.name
                names.add(ti.name.rstrip("/"))
                owners[ti.name.rstrip("/")] = (ti.uid, ti.gid)
                if ti.name in ("bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/apt", "usr/bin/dpkg"):
                    shells.append(ti.name)
    for f in files:
        assert f in names, f"{name}: {f} not in the image"
    assert not shells, f"{name}: has {shells}: not distroless"
    assert owners.get("run/ibvbridge") == (65532, 65532), f"{name}: /run/ibvbridge owned by {owners.get('run/ibvbridge')}"
    others = [n for n, o in owners.items() if o != (0, 0) and n not in ("run/ibvbridge", "home/ibvbridge")]
    assert not others, f"{name}: files not owned by root: {others[:5]}"
    size = sum(l["size"] for l in man["layers"])
    print(f"test-images: {name}: {m['digest']}, 3 layers, {size // 1024} KiB compressed, {len(names)} paths, entrypoint {entry}, user 65532:65532")
PYEOF
ok "layouts: manifests and blobs match their digests; entrypoint, user 65532, labels; tar entries in order, root-owned but /run/ibvbridge, no shell or package manager"

# podman: load both (storage in $work), then try to run them.
if ! command -v podman >/dev/null; then
  say "podman not installed (apt-get install podman): images not loaded"
  echo "test-images: $passed passed, 0 failed"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  say "not root: podman not tried (rootless podman needs subuid ranges this machine may lack)"
  echo "test-images: $passed passed, 0 failed"
  exit 0
fi
mkdir -p "$work/storage" "$work/runroot" "$work/tmp"
pod=(podman --root "$work/storage" --runroot "$work/runroot" --tmpdir "$work/tmp" --storage-driver vfs)
# podman names an image pulled from a layout after its path, which must be lowercase: a path of our own.
oci=/tmp/ibvbridge-oci-$$
mkdir -m 0700 "$oci"
for name in recv python; do
  ln -s "$work/a/$name" "$oci/$name"
  "${pod[@]}" pull -q "oci:$oci/$name" >"$work/$name.id" 2>"$work/pull.err" || { cat "$work/pull.err" >&2; fail "podman pull oci:$name"; }
  id=$(cat "$work/$name.id")
  "${pod[@]}" tag "$id" "localhost/ibvbridge-$name:test"
  user=$("${pod[@]}" image inspect --format '{{.Config.User}}' "$id")
  [[ $user == 65532:65532 ]] || fail "podman sees $name's user as $user"
done
ok "podman loads both OCI layouts (user 65532:65532 as podman reads it)"

# Running a container: the plain way, then the settings this kind of sandbox needs (cgroup v1 hybrid, rlimits
# it may not raise). The first that runs a container is used; none: say so in one line and stop here.
run_opts=()
ulimits=(--ulimit "nofile=$(ulimit -n):$(ulimit -n)" --ulimit "nproc=$(ulimit -u):$(ulimit -u)")
for opts in "" "--runtime runc --cgroupns=host --mount type=tmpfs,destination=/sys/fs/cgroup ${ulimits[*]}"; do
  # shellcheck disable=SC2086 # option words
  if out=$("${pod[@]}" run --rm $opts localhost/ibvbridge-python:test -c 'print("ran")' 2>&1) && [[ $out == ran ]]; then
    read -ra run_opts <<<"$opts"
    break
  fi
  err=$(tail -n 1 <<<"$out")
  run_opts=(none)
done
if [[ ${run_opts[*]-} == none ]]; then
  say "podman cannot run containers on this machine (${err:0:160}): images checked, not run"
  echo "test-images: $passed passed, 0 failed"
  exit 0
fi
say "podman runs containers here${run_opts[*]:+ with ${run_opts[*]}}"

port=$($PY -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
heaps=500
"${pod[@]}" volume create ibvbridge-rings >/dev/null
# recv and the consumer share nothing but the volume (the consumer has no network at all); the ring's
# memory passes over the Unix socket in the volume.
"${pod[@]}" run -d --name recv "${run_opts[@]}" --network host -v ibvbridge-rings:/run/ibvbridge \
  localhost/ibvbridge-recv:test recv --ring demo --dir /run/ibvbridge/rings --slots 64 --slot-size 128K \
  --hugepages off --log-format json "127.0.0.1:$port" >/dev/null
"${pod[@]}" run -d --name consumer "${run_opts[@]}" --network none -v ibvbridge-rings:/run/ibvbridge \
  localhost/ibvbridge-python:test -m ibvbridge.consume --ring demo --dir /run/ibvbridge/rings --wait --timeout-ms 30000 >/dev/null
for _ in $(seq 300); do
  "${pod[@]}" exec recv /usr/bin/ibvbridge stat --json --dir /run/ibvbridge/rings demo 2>/dev/null | grep -q '"state":"attached"' && break
  sleep 0.1
done
"${pod[@]}" run --rm "${run_opts[@]}" --network host localhost/ibvbridge-recv:test send "127.0.0.1:$port" \
  --heaps "$heaps" --heap-size 8192 --rate 0.2 >"$work/send.out" 2>&1 || { cat "$work/send.out" >&2; fail "send in a container"; }
"${pod[@]}" wait consumer >/dev/null
"${pod[@]}" logs consumer >"$work/consumer.out" 2>&1
"${pod[@]}" wait recv >/dev/null
"${pod[@]}" logs recv >"$work/recv.out" 2>&1
got=$($PY -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["heaps"])' "$work/consumer.out" 2>/dev/null || echo "?")
[[ $got == "$heaps" ]] || { cat "$work/recv.out" "$work/consumer.out" >&2; fail "the consumer container read $got heaps of $heaps"; }
ok "recv and a Python consumer in separate containers, sharing only the ring volume: $got of $heaps heaps read"
echo "test-images: $passed passed, 0 failed"
