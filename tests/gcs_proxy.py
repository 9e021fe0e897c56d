"""mitmproxy addon: sends Google Cloud Storage API traffic to the local emulator.

TensorFlow's `gs://` filesystem has its endpoints hard-coded (`https://www.googleapis.com/
storage/v1/`, `.../upload/storage/v1/`) but honours `https_proxy` and `CURL_CA_BUNDLE`. Run as

    mitmdump --listen-host 127.0.0.1 --listen-port P --set confdir=DIR \
        -s tests/gcs_proxy.py --set gcs_emulator=127.0.0.1:E

mitmproxy terminates TLS for those hosts with its own CA (`DIR/mitmproxy-ca-cert.pem`, the
file `CURL_CA_BUNDLE` names) and this addon forwards the plain requests to the emulator on
127.0.0.1:E. Any other host is refused: tests never reach the internet through this proxy.
"""

from __future__ import annotations

from mitmproxy import ctx, http

GCS_HOSTS = frozenset({"www.googleapis.com", "storage.googleapis.com"})


class ForwardToEmulator:
    """Rewrites requests for the GCS hosts to the emulator, and its links back to https."""

    def load(self, loader) -> None:
        loader.add_option("gcs_emulator", str, "", "host:port of the GCS emulator")

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.pretty_host not in GCS_HOSTS:
            flow.response = http.Response.make(
                502, f"test proxy: {flow.request.pretty_host} is not a GCS host".encode()
            )
            return
        host, port = ctx.options.gcs_emulator.rsplit(":", 1)
        original_host = flow.request.pretty_host
        flow.request.scheme = "http"
        flow.request.host = host
        flow.request.port = int(port)
        # The emulator builds upload session URLs from the Host header: keep the public one.
        flow.request.headers["Host"] = original_host

    def response(self, flow: http.HTTPFlow) -> None:
        # Resumable-upload session URLs come back as http://www.googleapis.com/...: the client
        # must come back through the proxy over https.
        if flow.response is None:
            return
        location = flow.response.headers.get("Location", "")
        for host in GCS_HOSTS:
            if location.startswith(f"http://{host}/"):
                flow.response.headers["Location"] = "https://" + location[len("http://") :]


addons = [ForwardToEmulator()]
