"""The webhook's own CA and serving certificate, made and renewed without a person.

Pure: certificates in, certificates out, the clock passed in. The CA signs the serving
certificate for the webhook Service's DNS names; the API server trusts the CA through the
caBundle of the MutatingWebhookConfiguration. A serving certificate is renewed when a third of
its life is left, when it no longer names every host, or when its CA is not the current one; the
CA is renewed when it would expire within two serving lifetimes, and the bundle then carries the
old CA beside the new one until the old one expires, so API servers that still hold the old
bundle keep trusting the replicas not yet reloaded.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVING_DAYS = 365
# Certificates start a little in the past: clocks of the API servers may lag this one.
_BACKDATE = timedelta(minutes=5)
_SKEW = timedelta(hours=1)


class CertificateError(ValueError):
    """Stored certificate material that cannot be read back (the keeper then makes new)."""


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes: the CA bundle the API server trusts (current CA first), the CA's key, and the
    serving certificate with its key."""

    ca_bundle: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _new_ca(
    common_name: str, now: datetime, days: int
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _serving(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: tuple[str, ...], now: datetime, days: int
) -> tuple[bytes, bytes]:
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + timedelta(days=days), ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue(
    hosts: tuple[str, ...], now: datetime, *, ca_days: int = CA_DAYS, serving_days: int = SERVING_DAYS
) -> TlsMaterial:
    """A new CA and a serving certificate for `hosts` (DNS names or IP addresses) signed by it."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host")
    ca, ca_key = _new_ca(f"tangram-admission-ca-{now:%Y%m%d%H%M%S}", now, ca_days)
    cert, key = _serving(ca, ca_key, hosts, now, serving_days)
    return TlsMaterial(ca.public_bytes(serialization.Encoding.PEM), _pem_key(ca_key), cert, key)


def _load(
    material: TlsMaterial,
) -> tuple[list[x509.Certificate], ec.EllipticCurvePrivateKey, x509.Certificate]:
    try:
        bundle = x509.load_pem_x509_certificates(material.ca_bundle)
        ca_key = serialization.load_pem_private_key(material.ca_key, password=None)
        cert = x509.load_pem_x509_certificate(material.cert)
        serialization.load_pem_private_key(material.key, password=None)
    except (ValueError, TypeError) as error:
        raise CertificateError(f"stored certificates cannot be read: {error}") from error
    if not bundle or not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("stored CA is missing or not an EC key")
    return bundle, ca_key, cert


def _spki(key: object) -> bytes:
    public_bytes = getattr(key, "public_bytes", None)
    if public_bytes is None:
        return b""
    spki: bytes = public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return spki


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n.value) for n in san}


def _third_left(cert: x509.Certificate, now: datetime) -> bool:
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now <= life / 3


def renew(
    material: TlsMaterial | None,
    hosts: tuple[str, ...],
    now: datetime,
    *,
    ca_days: int = CA_DAYS,
    serving_days: int = SERVING_DAYS,
) -> TlsMaterial | None:
    """What to store instead of `material`, or None when it is good as it is.

    None material, or material that cannot be read: everything new. Otherwise the CA is kept
    unless it nears expiry, and the serving certificate is reissued when due (see the module)."""
    if material is None:
        return issue(hosts, now, ca_days=ca_days, serving_days=serving_days)
    try:
        bundle, ca_key, cert = _load(material)
    except CertificateError:
        return issue(hosts, now, ca_days=ca_days, serving_days=serving_days)
    ca = bundle[0]
    ca_matches_key = _spki(ca.public_key()) == _spki(ca_key.public_key())
    ca_due = ca.not_valid_after_utc - now <= timedelta(days=2 * serving_days)
    if not ca_matches_key or ca_due or ca.not_valid_before_utc > now + _SKEW:
        fresh = issue(hosts, now, ca_days=ca_days, serving_days=serving_days)
        # the old CA stays trusted while it is valid and readable
        old = [c for c in bundle if c.not_valid_after_utc > now and ca_matches_key][:1]
        extra = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in old)
        return TlsMaterial(fresh.ca_bundle + extra, fresh.ca_key, fresh.cert, fresh.key)
    signed_by_ca = cert.issuer == ca.subject and _verifies(ca, cert)
    current = signed_by_ca and set(hosts) <= _names(cert)
    # a certificate from a replica whose clock runs ahead is kept unless it starts past the
    # skew any cluster tolerates: replicas with slightly different clocks never take turns renewing
    if current and not _third_left(cert, now) and cert.not_valid_before_utc <= now + _SKEW:
        return None
    new_cert, new_key = _serving(ca, ca_key, hosts, now, serving_days)
    # expired CAs leave the bundle
    kept = [c for c in bundle if c.not_valid_after_utc > now]
    ca_bundle = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in kept)
    return TlsMaterial(ca_bundle, material.ca_key, new_cert, new_key)


def _verifies(ca: x509.Certificate, cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def not_after(material: TlsMaterial) -> datetime:
    """When the serving certificate expires."""
    return x509.load_pem_x509_certificate(material.cert).not_valid_after_utc
