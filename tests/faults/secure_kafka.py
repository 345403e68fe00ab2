"""A PRIVATE Kafka broker that requires SASL (SCRAM-SHA-512 or PLAIN) over TLS, for the security tests.

The development broker (``deploy/local/``) listens in PLAINTEXT on 127.0.0.1; this one adds a ``SASL_SSL``
listener with a certificate from a throw-away CA (made with ``openssl``), a SCRAM-SHA-512 credential created
when the storage is formatted and a PLAIN user in the listener's JAAS config. Inter-broker and controller
traffic stay on PLAINTEXT listeners, which the tests also use to OBSERVE topics; the workers and the trace
publisher under test use only the SASL_SSL listener. The process is started here and stopped by its PID.
"""

from __future__ import annotations

import secrets
import shlex
import string
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import deploy.local as local
from deploy.local.binaries import find_java
from deploy.local.config import DEPLOY_DIR
from deploy.local.readiness import kafka_answering
from deploy.local.service import new_cluster_id
from streams.acls import Role, grants
from tests.faults.stack import free_port

# streams.acls names operations as kafka-acls.sh does; kafka-python's enum spells them in capitals
_OPERATION = {"Read": "READ", "Write": "WRITE", "Describe": "DESCRIBE", "Create": "CREATE",
              "DescribeConfigs": "DESCRIBE_CONFIGS", "AlterConfigs": "ALTER_CONFIGS"}  # fmt: skip

__all__ = ["SecureKafka"]

_OVERRIDES = """
############################# fault suite: SASL_SSL listener (overrides the lines above) ###################
listeners=INTERNAL://127.0.0.1:${internal},SASL_SSL://127.0.0.1:${secure},CONTROLLER://127.0.0.1:${controller}
advertised.listeners=INTERNAL://127.0.0.1:${internal},SASL_SSL://127.0.0.1:${secure}
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=${plain_jaas}
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=${keystore}
listener.name.sasl_ssl.ssl.keystore.password=${store_password}
listener.name.sasl_ssl.ssl.key.password=${store_password}
"""

# KRaft's authorizer: every SASL principal gets only what an ACL grants it; the PLAINTEXT listeners (the
# broker's own traffic and the tests' observation) are ANONYMOUS and made super users.
_AUTHORIZER = """
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=false
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass
class SecureKafka:
    state_dir: Path
    user: str = "combee"
    password: str = field(default_factory=lambda: "scram-" + secrets.token_urlsafe(20))
    store_password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    # more SCRAM-SHA-512 users (name -> password), created with the storage
    users: dict[str, str] = field(default_factory=dict)
    # enforce ACLs on the SASL_SSL listener (grant them with :meth:`grant` through the PLAINTEXT listener)
    authorizer: bool = False
    internal_port: int = 0
    secure_port: int = 0
    controller_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """PLAINTEXT, for the test's own observation."""
        return f"127.0.0.1:{self.internal_port}"

    @property
    def secure_bootstrap(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "tls" / "ca.pem"

    def _certificates(self) -> Path:
        tls = self.state_dir / "tls"
        tls.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                 "-days", "2", "-subj", "/CN=combee-fault-suite-ca", cwd=tls)  # fmt: skip
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                 "-subj", "/CN=127.0.0.1", cwd=tls)  # fmt: skip
        (tls / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server.pem", "-days", "2", "-extfile", "san.ext", cwd=tls)  # fmt: skip
        _openssl("pkcs12", "-export", "-in", "server.pem", "-inkey", "server.key", "-certfile", "ca.pem",
                 "-out", "server.p12", "-passout", f"pass:{self.store_password}", cwd=tls)  # fmt: skip
        return tls / "server.p12"

    def start(self, timeout_s: float = 300) -> SecureKafka:
        lib = local.fetch_kafka()
        java = find_java()
        self.internal_port = free_port(2)
        self.controller_port = self.internal_port + 1
        self.secure_port = free_port(1)
        while self.secure_port in (self.internal_port, self.controller_port):
            self.secure_port = free_port(1)
        keystore = self._certificates()
        data = self.state_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        base = string.Template((DEPLOY_DIR / "server.properties").read_text()).substitute(
            kafka_port=self.internal_port, controller_port=self.controller_port, log_dir=str(data)
        )
        props = self.state_dir / "server.properties"
        props.write_text(
            base
            + string.Template(_OVERRIDES).substitute(
                internal=self.internal_port,
                secure=self.secure_port,
                controller=self.controller_port,
                plain_jaas=(
                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                    + " ".join(f'user_{n}="{pw}"' for n, pw in {self.user: self.password, **self.users}.items())
                    + ";"
                ),
                keystore=str(keystore),
                store_password=self.store_password,
            )
            + (_AUTHORIZER if self.authorizer else "")
        )
        log = self.state_dir / "kafka.log"
        tool = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'log4j2.properties'}",
                "-cp", f"{lib}/*", "kafka.tools.StorageTool"]  # fmt: skip
        cluster = new_cluster_id()
        scram = [
            arg
            for name, password in {self.user: self.password, **self.users}.items()
            for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")
        ]
        subprocess.run(
            [*tool, "format", "-t", cluster, "-c", str(props), *scram],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        argv = [java, "-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'log4j2.properties'}",
                "-cp", f"{lib}/*", "kafka.Kafka", str(props)]  # fmt: skip
        with log.open("ab") as fh:
            fh.write(f"=== {shlex.join(argv[:3])} ...\n".encode())
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=self.state_dir)
        deadline = time.monotonic() + timeout_s
        while not kafka_answering(self.internal_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                self.stop()
                raise RuntimeError(f"the SASL_SSL broker did not start:\n{tail}")
            time.sleep(0.5)
        return self

    def grant(self, principal: str, role: Role, prefix: str) -> None:
        """Give ``principal`` (``User:NAME``) the rights :mod:`streams.acls` lists for ``role`` under ``prefix``."""
        from kafka.admin import (
            ACL,
            ACLOperation,
            ACLPermissionType,
            ACLResourcePatternType,
            KafkaAdminClient,
            ResourcePattern,
            ResourceType,
        )

        acls = [
            ACL(
                principal=principal,
                host="*",
                operation=ACLOperation[_OPERATION[op]],
                permission_type=ACLPermissionType.ALLOW,
                resource_pattern=ResourcePattern(
                    ResourceType.TOPIC if g.resource == "topic" else ResourceType.GROUP,
                    g.name,
                    ACLResourcePatternType.PREFIXED if g.prefixed else ACLResourcePatternType.LITERAL,
                ),
            )
            for g in grants(role, prefix)
            for op in g.operations
        ]
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="fault-suite-acls")
        try:
            result = admin.create_acls(acls)
        finally:
            admin.close()
        if result["failed"]:
            raise RuntimeError(f"the broker refused ACLs: {result['failed']}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None
