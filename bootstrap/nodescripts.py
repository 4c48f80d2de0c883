"""Small Python programs the bootstrap runs on the node (``python -I -c PROGRAM ARGS``).

They run with the interpreter chosen for the agent, so they can rely on its standard library
(and, for the sealing ones, on the unpacked bundle's ``cryptography``). None of them prints a
secret; arguments are never secret either (command lines are visible on the node).
"""

from __future__ import annotations

import shlex

# argv: archive sha256 agents_dir bundle_id url fresh
# Fetches the archive when a URL is given, checks its SHA-256, unpacks it into agents_dir/ID
# (again when fresh is "1"), byte-compiles it, points agents_dir/current at it and removes
# older bundles.
UNPACK = r"""
import compileall, hashlib, os, shutil, sys, tarfile, urllib.request
archive, sha, agents, bid, url, fresh = sys.argv[1:7]
dest = os.path.join(agents, bid)
if fresh == "1" or not os.path.isfile(os.path.join(dest, "BUNDLE.json")):
    if url:
        os.makedirs(os.path.dirname(archive), mode=0o700, exist_ok=True)
        part = archive + ".part"
        with urllib.request.urlopen(url, timeout=120) as r, open(part, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
        os.replace(part, archive)
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != sha:
        os.remove(archive)
        sys.exit("agent bundle checksum mismatch: expected %s, got %s" % (sha, h.hexdigest()))
    os.makedirs(agents, mode=0o755, exist_ok=True)
    work = os.path.join(agents, ".unpack-" + bid)
    shutil.rmtree(work, ignore_errors=True)
    with tarfile.open(archive) as t:
        t.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    compileall.compile_dir(os.path.join(work, "lib"), quiet=2, workers=0)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(work, dest)
    print("unpacked")
else:
    print("present")
link = os.path.join(agents, ".current-" + bid)
if os.path.lexists(link):
    os.remove(link)
os.symlink(bid, link)
os.replace(link, os.path.join(agents, "current"))
for name in os.listdir(agents):
    if name not in (bid, "current"):
        path = os.path.join(agents, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
if os.path.exists(archive):
    os.remove(archive)
"""

# argv: cert.pem -> sha256 hex of its DER form (the controller's cert_fingerprint)
CERT_FINGERPRINT = r"""
import hashlib, ssl, sys
with open(sys.argv[1]) as f:
    print(hashlib.sha256(ssl.PEM_cert_to_DER_cert(f.read())).hexdigest())
"""

# argv: lib_dir key_path -> prints the base64 X25519 public key; the private key stays in key_path (0600)
SEAL_KEYGEN = r"""
import base64, os, sys
sys.path.insert(0, sys.argv[1])
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
key = X25519PrivateKey.generate()
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, key.private_bytes(s.Encoding.Raw, s.PrivateFormat.Raw, s.NoEncryption()))
os.close(fd)
print(base64.b64encode(key.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)).decode())
"""

# argv: lib_dir key_path dest mode_octal sealed_b64 -> writes the opened secret to dest atomically
UNSEAL = r"""
import base64, os, sys
sys.path.insert(0, sys.argv[1])
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
lib, key_path, dest, mode, sealed = sys.argv[1:6]
try:
    with open(key_path, "rb") as f:
        key = X25519PrivateKey.from_private_bytes(f.read())
finally:
    os.remove(key_path)
blob = base64.b64decode(sealed)
eph, nonce, box = blob[:32], blob[32:44], blob[44:]
mine = key.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)
shared = key.exchange(X25519PublicKey.from_public_bytes(eph))
info = b"tether-bootstrap-seal-v1" + eph + mine
aead = ChaCha20Poly1305(HKDF(hashes.SHA256(), 32, None, info).derive(shared))
plain = aead.decrypt(nonce, box, dest.encode())
os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
tmp = dest + ".tether-tmp"
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, plain)
os.fsync(fd)
os.close(fd)
os.chmod(tmp, int(mode, 8))
os.replace(tmp, dest)
"""


def command(python: str, program: str, *args: str) -> str:
    """``python -I -c PROGRAM ARGS``, quoted for /bin/sh."""
    return " ".join(shlex.quote(x) for x in (python, "-I", "-c", program.strip() + "\n", *args))
