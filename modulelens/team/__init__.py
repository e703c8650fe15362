"""The team repository: push stored versions (captures, opsets, candidates with their reports,
stats runs, kernel packs) to a shared remote and pull them back, verified and untrusted, on another machine.

* :mod:`.model`: addresses (``wandb://ENTITY/PROJECT[/NAME:ALIAS]``) and the typed push/pull records;
  the :class:`~.model.Remote` protocol a remote implements.
* :mod:`.bundle`: what a push of one reference sends. :mod:`.packs`: a pack file as a repository
  version. :mod:`.importer`: verifying a fetched folder and storing it unsigned.
  :mod:`.wandb_remote`: W&B artifacts. :mod:`.handover`: ``push`` and ``pull``.
"""
