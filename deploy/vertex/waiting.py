"""Jobs created on Vertex AI, as objects to wait on: their state polled, a CustomJob's logs
streamed from Cloud Logging while it runs (the Vertex AI SDK's `CustomJob.wait` shows only the
state and a link to the console).

Logs: Vertex AI writes each replica's output to Cloud Logging as entries of resource type
`ml_job` labelled with the job's id; `entries:list` (Logging API v2, REST, the same
credentials) is asked for those newer than the last one shown at each poll. The caller needs
roles/logging.viewer; without it the job is still waited on, with one line saying so.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

from deploy.cloud import api

LOGGING_ENDPOINT = "logging.googleapis.com"
DEFAULT_POLL_SECONDS = 30.0
# JobState names (google.cloud.aiplatform.v1.JobState) after which nothing changes
ENDED = frozenset(
    {
        "JOB_STATE_SUCCEEDED",
        "JOB_STATE_FAILED",
        "JOB_STATE_CANCELLED",
        "JOB_STATE_EXPIRED",
        "JOB_STATE_PARTIALLY_SUCCEEDED",
    }
)
SUCCEEDED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED"})
_PAGE_SIZE = 1000


class JobFailed(api.ServiceError):
    """The job ended without succeeding: its state and Vertex AI's error message."""


@dataclasses.dataclass
class Job:
    """A Vertex AI job by resource name; `get` reads it (the client library's message).

    `wait()` polls until the job ends, printing each change of state (and, with
    `logs`, the job's log lines) to `out`, and returns the job's last message; a job that
    failed, was cancelled or expired raises JobFailed."""

    cloud: api.Cloud
    name: str
    get: Callable[[str], object]
    logs: LogStream | None = None

    @property
    def id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    def state(self) -> str:
        return _state_name(self.get(self.name))

    def wait(
        self,
        *,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        timeout_seconds: float | None = None,
        out=None,
    ):
        out = out or sys.stdout
        started = time.monotonic()
        shown = None
        while True:
            job = self.get(self.name)
            state = _state_name(job)
            if self.logs is not None:
                self.logs.show_new(out)
            if state != shown:
                print(f"{self.name}: {state}", file=out, flush=True)
                shown = state
            if state in ENDED:
                break
            if timeout_seconds is not None and time.monotonic() - started > timeout_seconds:
                raise TimeoutError(
                    f"{self.name} is still {state} after {timeout_seconds:.0f} s; wait() again "
                    "to go on waiting (the job runs on regardless)."
                )
            time.sleep(poll_seconds)
        if state not in SUCCEEDED:
            error = getattr(getattr(job, "error", None), "message", "") or "no error message"
            raise JobFailed(f"{self.name} ended {state}: {error}")
        return job


def _state_name(job) -> str:
    state = job.state  # a proto-plus enum
    return getattr(state, "name", str(state))


class LogStream:
    """The log entries of one CustomJob, each shown once, oldest first."""

    def __init__(self, cloud: api.Cloud, job_id: str, *, endpoint: str | None = None):
        self.cloud = cloud
        self.job_id = job_id
        self.endpoint = endpoint or LOGGING_ENDPOINT
        self.after = ""  # the newest timestamp shown
        self._seen_at_after: set[str] = set()  # insertIds shown with that timestamp
        self._refused = False
        self._session: Any = None  # `cloud.session()`, made at the first request

    def request(self, after: str, page_token: str | None = None) -> api.ApiRequest:
        """The entries:list request for the entries from timestamp `after` on (a page of
        them after the first: the same filter, with the token the last page gave)."""
        filter_ = f'resource.type="ml_job" AND resource.labels.job_id="{self.job_id}"'
        if after:
            filter_ += f' AND timestamp>="{after}"'
        body = {
            "resourceNames": [f"projects/{self.cloud.project}"],
            "filter": filter_,
            "orderBy": "timestamp asc",
            "pageSize": _PAGE_SIZE,
        }
        if page_token:
            body["pageToken"] = page_token
        base = self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}"
        return api.ApiRequest("POST", f"{base}/v2/entries:list", body)

    def show_new(self, out) -> int:
        """Prints the entries not shown yet; returns how many."""
        if self._refused:
            return 0
        shown, token, after = 0, None, self.after
        while True:
            answer = self._send(self.request(after, token))
            if answer is None:
                return shown
            for entry in answer.get("entries", []):
                if self._is_new(entry):
                    print(_line(entry), file=out, flush=True)
                    shown += 1
            token = answer.get("nextPageToken")
            if not token:
                return shown

    def _is_new(self, entry: dict) -> bool:
        stamp, insert_id = entry.get("timestamp", ""), entry.get("insertId", "")
        if stamp < self.after or (stamp == self.after and insert_id in self._seen_at_after):
            return False
        if stamp > self.after:
            self.after, self._seen_at_after = stamp, set()
        self._seen_at_after.add(insert_id)
        return True

    def _send(self, request: api.ApiRequest) -> dict | None:
        if self._session is None:
            self._session = self.cloud.session()
        answer = self._session.post(request.url, json=request.body, timeout=60)
        if answer.status_code in (401, 403):
            self._refused = True
            print(
                f"(no logs: Cloud Logging refused to list them ({answer.status_code}); the "
                "caller needs roles/logging.viewer)",
                file=sys.stderr,
            )
            return None
        if answer.status_code != 200:
            raise api.ServiceError(
                f"Cloud Logging answered {answer.status_code} to entries:list: {answer.text[:300]}"
            )
        return answer.json()


def _line(entry: dict) -> str:
    """One log entry as a line: the replica (workerpool0-0) and the text."""
    labels = entry.get("labels", {})
    task = labels.get("ml.googleapis.com/task_name") or labels.get("task_name") or "job"
    payload = entry.get("jsonPayload", {})
    text = entry.get("textPayload") or payload.get("message") or str(payload or "")
    return f"[{task}] {text.rstrip()}"
