"""Background jobs: one tool call run in a detached process of its own, on one repository.

Every front end that runs a tool in the background (the MCP server's ``start_job`` and
``job_status``, the web UI's actions and Stop button) uses this one runtime, so a job started
anywhere on a repository is seen and can be stopped from everywhere:

* a job is a record, ``<repo>/.jobs/<id>.json`` (:class:`JobRecord`: the tool, its validated
  request, state, progress, result or error), with the process's output in ``<id>.log``;
* :meth:`JobTable.start` starts ``python -m modulelens.jobs.process`` on the record, in a session
  of its own: it outlives the server that started it, and any server on the same repository can
  read it, wait for it (:meth:`JobTable.wait`) or stop it (:meth:`JobTable.cancel`);
* cancelling asks the job process to cancel its call (see :mod:`modulelens.cancellation`: the
  code waiting on the tool's workers kills their process groups and the tool leaves the
  repository consistent), and kills it when the tool has not stopped within ``CANCEL_WAIT_S``;
* a job's files are removed a week after it ended (by a later start);
* a front end that runs a long call in its own process (the CLI) records it as a job it owns
  (:func:`~modulelens.jobs.process.run_as_job`): listed, followed and stopped the same way.

Sampling is not available inside a job (there is no request to carry it).
"""

from modulelens.jobs.table import CANCEL_WAIT_S, JobRecord, JobState, JobTable

__all__ = ["CANCEL_WAIT_S", "JobRecord", "JobState", "JobTable"]
