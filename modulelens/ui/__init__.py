"""The local web UI (``modulelens ui``): captures, operator cards, candidates, training statistics
and the repository's jobs, served by Starlette and uvicorn from this package alone (its
templates, CSS and JavaScript are in ``templates/`` and ``static/``; nothing is loaded from the
internet). Every page gets its data from the tool registry, and every action runs a tool.

- :mod:`modulelens.ui.server`: ``UiServer`` / ``serve`` (binding, token, uvicorn);
- :mod:`modulelens.ui.app`: the Starlette application (routes, error pages);
- :mod:`modulelens.ui.security`: the rules that keep it safe (see there);
- :mod:`modulelens.ui.pages`, :mod:`modulelens.ui.api`: pages and JSON endpoints;
- :mod:`modulelens.ui.jobs`: actions run as stoppable background jobs (:mod:`modulelens.jobs`);
- :mod:`modulelens.ui.sections`: the navigation, and the extension point for searches and packs.
"""
