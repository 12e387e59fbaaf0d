"""The chat judge over HTTPS, as a user points it at a TLS endpoint: a local HTTPS server with a self-signed
certificate (made with `cryptography`), trusted through SSL_CERT_FILE. A verdict goes through; a certificate the judge
cannot verify is one JudgeFailure line naming the fix (an env failure, never the agent's 0, not retried), as is the
doctor's report; the whole-attempt deadline (`deadline_http.py`) holds over TLS when the server trickles its answer
after the handshake."""

import datetime
import ipaddress
import json
import socket
import ssl
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.tasks.webgym.judge import ChatJudge, JudgeFailure
from jaxwebrl.env.tasks.webgym.judge_probe import check_judge
from jaxwebrl.env.tasks.webgym.verdicts import failure_cause
from tests.env.test_judge import KEY, Endpoint, request, verdict


def self_signed(folder, name: str):
    """(cert.pem, key.pem) of a self-signed certificate for 127.0.0.1 (an EC P-256 key: fast to make)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    return {"server": self_signed(folder, "judge-server"), "other": self_signed(folder, "another-ca")}


def server_context(certs) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certs["server"])
    return context


@pytest.fixture
def https_endpoint(certs):
    server = Endpoint([(200, verdict(), 0.0)])
    server.server.socket = server_context(certs).wrap_socket(server.server.socket, server_side=True)
    server.url = server.url.replace("http://", "https://")
    yield server
    server.close()


def test_a_verdict_goes_through_tls_with_the_ca_bundle_a_user_gives(https_endpoint, certs, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    monkeypatch.setenv("SSL_CERT_FILE", certs["server"][0])
    judge = ChatJudge(base_url=https_endpoint.url, model="judge-model", api_key_env="TEST_JUDGE_KEY", retries=0)
    assert judge.judge(request()).reward == 1.0
    assert https_endpoint.headers[-1]["Authorization"] == f"Bearer {KEY}"   # sent inside TLS, as over HTTP


@pytest.mark.parametrize("bundle", [None, "other"])
def test_a_certificate_the_judge_cannot_verify_is_one_line_naming_the_fix(https_endpoint, certs, monkeypatch,
                                                                          bundle):
    """The system's CAs (no bundle) or another CA's bundle: an env failure in one line that names the certificate
    and SSL_CERT_FILE, not retried (the next attempt would fail alike), never 'nothing answers there'."""
    if bundle:
        monkeypatch.setenv("SSL_CERT_FILE", certs[bundle][0])
    else:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    judge = ChatJudge(base_url=https_endpoint.url, model="m", retries=2, backoff_s=0.01)
    with pytest.raises(JudgeFailure, match=r"^judge m on shop-1: TLS certificate not verified \(.*\): .*SSL_CERT_FILE"
                                           r".* after 1 attempt\(s\) at https://") as info:
        judge.judge(request())
    message = str(info.value)
    assert isinstance(info.value, EnvFailure) and "\n" not in message and "Traceback" not in message
    assert failure_cause(message) == "tls" and not https_endpoint.bodies   # no request left the handshake
    report = check_judge({"backend": "chat", "url": https_endpoint.url, "model": "m", "retries": 0})
    assert not report["ok"] and "SSL_CERT_FILE" in report["fix"] and "start the judge server" not in report["fix"]


def test_the_attempt_deadline_holds_over_tls_when_the_answer_trickles_after_the_handshake(certs, monkeypatch):
    """A TLS server that completes the handshake and then sends its headers a byte every 0.2 s (8 s in all) is a
    timeout after about timeout_s=0.5 s, as over plain HTTP."""
    monkeypatch.setenv("SSL_CERT_FILE", certs["server"][0])
    body = json.dumps({"choices": [{"message": {"content": verdict()}}]}).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    handshaken = threading.Event()

    def trickle():
        raw, _ = listener.accept()
        try:
            with server_context(certs).wrap_socket(raw, server_side=True) as conn:
                handshaken.set()
                conn.recv(1 << 20)
                for i in range(len(answer)):
                    conn.sendall(answer[i:i + 1])
                    time.sleep(0.2)
        except OSError:
            pass   # the judge gave up

    threading.Thread(target=trickle, daemon=True).start()
    judge = ChatJudge(base_url=f"https://127.0.0.1:{listener.getsockname()[1]}/v1", model="m", retries=0,
                      timeout_s=0.5)
    start = time.monotonic()
    try:
        with pytest.raises(JudgeFailure, match=r"timed out .* after 1 attempt") as info:
            judge.judge(request())
    finally:
        listener.close()
    assert handshaken.is_set() and time.monotonic() - start < 1.5 and failure_cause(str(info.value)) == "timeout"
