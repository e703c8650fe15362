# Escape: read the reference data of the repository in the README's default layout
# (`.modulelens` inside the project folder, which is on the candidate's import path) and whatever
# the host keeps in /tmp (the build folder lives there). Everything it finds is listed in the error
# it raises; finding nothing, it answers like a plain wrapper.
import os
import torch

found = []
for folder in ("__REPO__", "__PROJECT__/.modulelens", "/tmp"):
    try:
        names = os.listdir(folder)
    except OSError:
        continue
    found += [f"{folder}/{n}" for n in names if "__MARKER__" in n or folder != "/tmp"]
for path in ("__REPO__/__MARKER__.txt", "/tmp/__MARKER__.txt"):
    try:
        with open(path) as f:
            found.append(f"{path}={f.read()}")
    except OSError:
        pass
project = os.listdir("__PROJECT__")  # the project itself stays readable (it is on the import path)


def forward(x, dim, half_to_float):
    if found or "code.py" not in project:
        raise RuntimeError(f"found {found}; project holds {project}")
    return torch.softmax(x, dim)
