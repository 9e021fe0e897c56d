"""What the deploy commands share: the Google Cloud target, the REST requests each command
sends (printed verbatim by `--dry_run`), and the command-line plumbing.

Every command builds its request bodies here, as Vertex AI's REST API spells them (camelCase,
int64 values as strings), so `--dry_run` prints exactly what the SDK then sends; the tests
check that against the bodies a fake service receives.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Sequence

from trainer.storage import paths

DEFAULT_REGION = "us-central1"
_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$|^\d+$")
_ID = re.compile(r"^\d+$")
_NO_CREDENTIALS = (
    "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
    "service account's key file"
)


class DeployError(ValueError):
    """Bad input to a deploy command: nothing was sent, nothing was written."""


class Unreachable(DeployError):
    """Google Cloud could not be asked: no credentials, or no network to it. A dry run, which
    needs neither, goes on without what it could not read."""


def cannot_read(error: Exception) -> type[DeployError]:
    """The DeployError to raise for `error`, met reading a file: `Unreachable` where it is a
    missing credential or a connection that could not be made."""
    auth = sys.modules.get("google.auth.exceptions")
    unreachable = (ConnectionError,) + (
        (auth.DefaultCredentialsError, auth.RefreshError, auth.TransportError) if auth else ()
    )
    requests = sys.modules.get("requests.exceptions")
    if requests is not None:
        unreachable += (requests.ConnectionError,)
    return Unreachable if isinstance(error, unreachable) else DeployError


class ServiceError(RuntimeError):
    """A service answered a request with an error, or could not be reached; the message says
    which, and what it said."""


@dataclasses.dataclass(frozen=True)
class Cloud:
    """Where requests go: a project and region, optionally another API endpoint (a private
    endpoint, or a local fake in tests) and credentials (default: application default)."""

    project: str
    region: str = DEFAULT_REGION
    api_endpoint: str | None = None
    credentials: object = None

    def __post_init__(self):
        if not _PROJECT.match(self.project or ""):
            raise DeployError(
                f"project ({self.project!r}) is not a Google Cloud project id or "
                f"number{_placeholder(self.project)}; pass --project=YOUR_PROJECT_ID "
                "(`gcloud config get-value project` prints yours)."
            )
        if not _REGION.match(self.region or ""):
            raise DeployError(
                f"region ({self.region!r}) is not a Vertex AI region such as "
                f"{DEFAULT_REGION}; pass --region."
            )

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    def url(self, path: str) -> str:
        """The REST URL of `path` (`projects/.../customJobs`, `...:predict`)."""
        base = self.api_endpoint or f"https://{self.region}-aiplatform.googleapis.com"
        return f"{base.rstrip('/')}/v1/{path}"

    def resource(self, collection: str, id_or_name: str) -> str:
        """A full resource name from an id (`123`) or a full name (`projects/.../123`)."""
        if id_or_name.startswith("projects/"):
            return id_or_name
        if not _ID.match(id_or_name) and not id_or_name.startswith("{"):
            raise DeployError(
                f"{collection[:-1]} ({id_or_name!r}) is neither a numeric id nor "
                f"a resource name like {self.parent}/{collection}/123"
                f"{_placeholder(id_or_name)}."
            )
        return f"{self.parent}/{collection}/{id_or_name}"

    def init_sdk(self) -> None:
        """Points the Vertex AI SDK at this target, over REST (the transport --dry_run shows)."""
        from google.cloud import aiplatform

        options: dict[str, object] = dict(
            project=self.project, location=self.region, api_transport="rest"
        )
        if self.api_endpoint:
            options["api_endpoint"] = self.api_endpoint
        if self.credentials is not None:
            options["credentials"] = self.credentials
        aiplatform.init(**options)

    def session(self):
        """An HTTP session that signs requests with this target's credentials (default: the
        application default ones, cloud-platform scope): for the REST calls no client
        library makes as we need them (rawPredict, Cloud Logging's entries:list)."""
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        credentials = self.credentials
        if credentials is None:
            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        return AuthorizedSession(credentials)

    def job_client(self):
        """The client library's JobService client over REST, at this target. (Jobs are created
        through it rather than the SDK's job classes: it sends the body `--dry_run` prints,
        field for field, where the SDK rebuilds a job from its own arguments.)"""
        return self._client("JobServiceClient")

    def model_client(self):
        """The client library's ModelServiceClient over REST, at this target: the Model
        Registry calls the SDK has no method for (importing an evaluation) or rebuilds from
        its own arguments (listing models, versions and evaluations; merging aliases)."""
        return self._client("ModelServiceClient")

    def pipeline_client(self):
        """The client library's PipelineServiceClient over REST, at this target (the body
        `deploy.pipeline --dry_run` prints, where the SDK's PipelineJob.submit also looks up
        and creates the pipeline root's bucket)."""
        return self._client("PipelineServiceClient")

    def _client(self, service: str):
        from google.cloud import aiplatform_v1

        return getattr(aiplatform_v1, service)(
            transport="rest",
            client_options={
                "api_endpoint": self.api_endpoint or f"{self.region}-aiplatform.googleapis.com"
            },
            credentials=self.credentials,
        )


def _placeholder(value: str | None) -> str:
    """A note for a value that looks like a placeholder of the docs (capitals alone: P,
    ENDPOINT_ID), else ""."""
    if value and re.fullmatch(r"[A-Z][A-Z0-9_]*", value):
        return f" ({value} looks like a placeholder from the docs: put your own value there)"
    return ""


def canonical(message_type: str, body: dict, what: str) -> dict:
    """`body` as the client library sends it: parsed into its v1 message (`CustomJob`,
    `HyperparameterTuningJob`) and written back as REST JSON, so default values (0, false,
    *_UNSPECIFIED) are left out and int64 values are strings.

    Raises:
        DeployError: a field the message does not have, or a value of the wrong type, named.
    """
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    message = getattr(aiplatform_v1, message_type).pb()()
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as e:
        raise DeployError(f"{what}: {str(e).split(' Available Fields')[0]}") from None
    return json_format.MessageToDict(message)


@dataclasses.dataclass(frozen=True)
class ApiRequest:
    """One REST request: method, URL and JSON body (None for GET and DELETE)."""

    method: str
    url: str
    body: dict | None = None

    def to_json(self) -> dict:
        return {"method": self.method, "url": self.url, "body": self.body}


def show(requests: Sequence[ApiRequest], out=None) -> None:
    """Prints the requests as a JSON list (what `--dry_run` shows)."""
    out = out or sys.stdout
    json.dump([r.to_json() for r in requests], out, indent=2)
    out.write("\n")


def int64(value: int) -> str:
    """int64 fields travel as strings in Google's REST JSON."""
    return str(int(value))


def file_stem(display_name: str) -> str:
    """A display name as part of a file name: letters, digits, `.`, `_` and `-` kept, every
    other run of characters (`/`, spaces, `..` at the start) a hyphen, so that a display name
    (any text, to Vertex AI) never names a path outside the folder the file goes in."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", display_name).lstrip(".-")[:100]
    return stem or "job"


def positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise DeployError(f"{name} ({value!r}) must be a positive integer.")
    return value


def gcs_uri(name: str, value: str) -> str:
    try:
        paths.split_gcs(value or "")
    except ValueError:
        raise DeployError(
            f"{name} ({value!r}) must be a Cloud Storage URI, gs://BUCKET/PATH."
        ) from None
    return value


# Command-line plumbing -------------------------------------------------------------------


def parser(description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )


def add_cloud_flags(p: argparse.ArgumentParser, *, project_required: bool = True) -> None:
    """--project, --region, --api_endpoint and --dry_run."""
    p.add_argument("--project", required=project_required, help="Google Cloud project id.")
    p.add_argument("--region", default=DEFAULT_REGION, help="Vertex AI region.")
    p.add_argument(
        "--api_endpoint",
        default=None,
        help="Another Vertex AI API endpoint (default: REGION-aiplatform...).",
    )
    p.add_argument(
        "--dry_run",
        action="store_true",
        help="Print the exact REST requests as JSON and send nothing.",
    )


def cloud_from(args: argparse.Namespace) -> Cloud:
    return Cloud(project=args.project, region=args.region, api_endpoint=args.api_endpoint)


def main_of(run: Callable[[list[str] | None], int]) -> Callable[..., int]:
    """Wraps a command's `run(argv)`: bad input (missing credentials included) prints one line
    and exits 2; a service's error answer prints one line and exits 1."""

    def main(argv: list[str] | None = None) -> int:
        try:
            return run(argv)
        except (DeployError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except Exception as e:
            known = _cloud_error(e)
            if known is None:
                raise
            message, code = known
            print(f"error: {message}", file=sys.stderr)
            return code

    return main


def _cloud_error(error: Exception) -> tuple[str, int] | None:
    """(one line, exit code) for an error of a service or of Google's client libraries, or
    None for any other (a bug, whose traceback is worth seeing). The libraries are looked up
    only when loaded: an error cannot come from one that was not."""
    if isinstance(error, ServiceError):
        return str(error), 1
    auth = sys.modules.get("google.auth.exceptions")
    if auth is not None and isinstance(error, auth.DefaultCredentialsError):
        return f"no Google Cloud credentials were found: {_NO_CREDENTIALS}.", 2
    if auth is not None and isinstance(error, auth.RefreshError):
        return f"the Google Cloud credentials were refused ({_first_line(error)}): " + (
            f"{_NO_CREDENTIALS}."
        ), 2
    core = sys.modules.get("google.api_core.exceptions")
    if core is not None and isinstance(error, core.GoogleAPICallError):
        return f"Google Cloud answered {error.code}: {_first_line(error.message)}", 1
    return None


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
