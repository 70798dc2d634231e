"""Where a webhook may go (`mas.outbox.targets`, and `check_notify_url` at submit): every address a receiver's
host resolves to is checked, whatever form the host takes; MAS_WEBHOOK_ALLOWED_HOSTS makes exceptions by name
or by network. Pure code: IP literals and `localhost` resolve on this machine with no network, and every other
name is answered by an injected resolver (`tests.dns_faults.Dns`, also the stand-in for a rebinding DNS server)."""

from __future__ import annotations

import base64
import ipaddress
import re
import socket

import pytest
from pydantic import ValidationError

from mas.config import Settings
from mas.domain.identity import STUDIO
from mas.errors import InvalidInput
from mas.outbox import targets
from mas.pipeline.production import check_notify_url
from tests.dns_faults import Dns

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
PUBLIC = "93.184.216.34"  # a global address; as an IP literal it resolves locally, nothing is sent to it
NO_RULES = targets.Rules()


def _settings(**values) -> Settings:
    return Settings(webhook_secret=SECRET, **values)


REFUSED = [
    ("127.0.0.1", "a loopback address 127.0.0.1"),
    ("127.1", "a loopback address 127.0.0.1"),
    ("2130706433", "a loopback address 127.0.0.1"),
    ("0x7f000001", "a loopback address 127.0.0.1"),
    ("0177.0.0.1", "a loopback address 127.0.0.1"),
    ("[::1]", "a loopback address ::1"),
    ("0.0.0.0", "an unspecified address 0.0.0.0"),
    ("0", "an unspecified address 0.0.0.0"),
    ("[::]", "an unspecified address ::"),
    ("169.254.169.254", "a link-local address 169.254.169.254"),
    ("10.0.0.1", "a private address 10.0.0.1"),
    ("172.16.0.1", "a private address 172.16.0.1"),
    ("172.31.255.255", "a private address 172.31.255.255"),
    ("192.168.1.1", "a private address 192.168.1.1"),
    ("100.64.0.1", "a reserved or non-public address 100.64.0.1"),
    ("198.18.0.1", "a reserved or non-public address 198.18.0.1"),
    ("240.0.0.1", "a reserved or non-public address 240.0.0.1"),
    ("255.255.255.255", "a reserved or non-public address 255.255.255.255"),
    ("224.0.0.1", "a multicast address 224.0.0.1"),
    ("[ff02::1]", "a multicast address ff02::1"),
    ("[fe80::1]", "a link-local address fe80::1"),
    ("[fc00::1]", "a private address fc00::1"),
    ("[::ffff:127.0.0.1]", "a loopback address ::ffff:7f00:1 (IPv4 127.0.0.1)"),
    ("[::ffff:10.0.0.1]", "a private address ::ffff:a00:1 (IPv4 10.0.0.1)"),
    ("[64:ff9b::7f00:1]", "a loopback address 64:ff9b::7f00:1 (IPv4 127.0.0.1)"),  # NAT64
    ("[2002:a9fe:a9fe::1]", "a link-local address 2002:a9fe:a9fe::1 (IPv4 169.254.169.254)"),  # 6to4
    ("localhost", "a loopback address"),  # resolved for real: 127.0.0.1 or ::1
]


@pytest.mark.parametrize(("host", "reason"), REFUSED, ids=[host for host, _ in REFUSED])
def test_every_form_of_an_internal_address_is_refused_as_the_resolver_reads_it(host, reason):
    try:
        socket.getaddrinfo(host.strip("[]"), 80, type=socket.SOCK_STREAM)
    except OSError:
        pytest.skip(f"this machine's resolver does not read {host}")  # then nothing could connect to it either
    with pytest.raises(targets.TargetRefused, match=re.escape("resolves to " + reason)):
        targets.check_url(f"http://{host}:8080/hooks", NO_RULES)
    with pytest.raises(targets.TargetRefused, match="MAS_WEBHOOK_ALLOWED_HOSTS"):
        targets.check_url(f"https://{host}/hooks", NO_RULES)


@pytest.mark.parametrize("host", [PUBLIC, f"[::ffff:{PUBLIC}]", "[64:ff9b::5db8:d822]", "[2606:4700:4700::1111]"])
def test_a_public_address_passes_and_is_the_one_to_connect_to(host):
    target = targets.check_url(f"https://{host}:8443/hooks?x=1", NO_RULES)
    assert target.port == 8443 and target.host == host.strip("[]")
    assert ipaddress.ip_address(target.address) == ipaddress.ip_address(
        socket.getaddrinfo(host.strip("[]"), 1)[0][4][0]
    )


def test_a_name_with_one_private_address_among_public_ones_is_refused():
    dns = Dns(hooks_example_com=[PUBLIC, "151.101.1.69", "10.0.0.7"], public_example_com=[PUBLIC, "151.101.1.69"])
    with pytest.raises(targets.TargetRefused, match=re.escape("a private address 10.0.0.7")):
        targets.check_url("https://hooks.example.com/in", NO_RULES, dns)
    target = targets.check_url("https://public.example.com/in", NO_RULES, dns)
    assert target.addresses == (PUBLIC, "151.101.1.69") and target.host == "public.example.com"


def test_the_studios_own_services_are_refused_by_name_and_by_address():
    settings = _settings(
        database_url="postgresql://studio:pw@db.studio.example:5432/mas",
        broker_url="redis://cache.studio.example:6379/0",
        comfyui_url="http://comfy.studio.example:8188",
        llm_url="https://llm.example.org/v1",
        letta_url="http://letta.studio.example:8283",
        s3_endpoint_url="https://s3.studio.example",
    )
    dns = Dns(db_studio_example="151.101.1.10", cache_studio_example="151.101.1.11",
              comfy_studio_example="151.101.1.12", llm_example_org="151.101.1.13",
              letta_studio_example="151.101.1.14", s3_studio_example="2a04:4e42::15",
              elsewhere_example_com="151.101.1.13", mapped_example_com="::ffff:151.101.1.11")  # fmt: skip
    assert targets.service_hosts(settings) == {
        "db.studio.example", "cache.studio.example", "comfy.studio.example", "llm.example.org",
        "letta.studio.example", "s3.studio.example",
    }  # fmt: skip
    rules = targets.rules(settings, dns)
    for host in ("db.studio.example", "CACHE.studio.example.", "comfy.studio.example", "llm.example.org",
                 "letta.studio.example", "s3.studio.example"):  # fmt: skip
        with pytest.raises(targets.TargetRefused, match="names a host of the studio's own services"):
            targets.check_url(f"https://{host}/hook", rules, dns)
    for url, address in (
        ("https://elsewhere.example.com/hook", "151.101.1.13"),
        ("http://151.101.1.12:9/hook", "151.101.1.12"),
        ("http://[2a04:4e42::15]/hook", "2a04:4e42::15"),
        ("http://mapped.example.com/hook", "::ffff:9765:10b (IPv4 151.101.1.11)"),
    ):
        with pytest.raises(
            targets.TargetRefused, match=re.escape(f"an address of the studio's own services {address}")
        ):
            targets.check_url(url, rules, dns)
    assert targets.check_url("http://151.101.1.99/hook", rules, dns).address == "151.101.1.99"
    allowed = targets.rules(settings.changed(webhook_allowed_hosts="llm.example.org,151.101.1.12/32"), dns)
    assert targets.check_url("https://llm.example.org/hook", allowed, dns).address == "151.101.1.13"
    assert targets.check_url("http://151.101.1.12:9/hook", allowed, dns).address == "151.101.1.12"


def test_a_name_that_rebinds_to_loopback_after_submit_is_refused_at_delivery():
    dns = Dns(hooks_rebind_example=[[PUBLIC], ["127.0.0.1"]])
    url = "https://hooks.rebind.example/in"
    settings = _settings()
    assert check_notify_url(settings, STUDIO, url, resolver=dns) == url  # submitted: public then
    rules = targets.rules(settings, dns)
    with pytest.raises(targets.TargetRefused, match=re.escape("a loopback address 127.0.0.1")):
        targets.check_host("hooks.rebind.example", 443, rules, dns)  # delivered: loopback now
    assert dns.calls["hooks.rebind.example"] == 2


def test_a_listed_name_is_allowed_whatever_it_resolves_to():
    dns = Dns(receiver_internal=["10.0.0.5", "127.0.0.1"], other_internal="10.0.0.6")
    rules = targets.rules(_settings(webhook_allowed_hosts="Receiver.Internal."), dns)
    assert targets.check_url("http://receiver.internal:8000/in", rules, dns).addresses == ("10.0.0.5", "127.0.0.1")
    with pytest.raises(targets.TargetRefused, match=re.escape("a private address 10.0.0.6")):
        targets.check_url("http://other.internal:8000/in", rules, dns)


def test_a_listed_network_allows_the_addresses_in_it_and_no_other():
    dns = Dns(inside="10.1.2.3", straddles=["10.1.2.3", "10.9.9.9"])
    rules = targets.rules(_settings(webhook_allowed_hosts="10.1.0.0/16, 127.0.0.0/8 ,::1"), dns)
    assert targets.check_url("http://inside:8000/in", rules, dns).address == "10.1.2.3"
    with pytest.raises(targets.TargetRefused, match=re.escape("a private address 10.9.9.9")):
        targets.check_url("http://straddles:8000/in", rules, dns)
    for host in ("127.0.0.1", "127.1", "localhost", "[::1]", "[::ffff:127.0.0.1]"):
        targets.check_url(f"http://{host}:9/in", rules, dns)  # the studio's own LLM's 127.0.0.1 too: allowed
    with pytest.raises(targets.TargetRefused, match="link-local"):
        targets.check_url("http://169.254.169.254/latest/meta-data", rules, dns)


def test_a_name_that_does_not_resolve_is_retryable_at_delivery_and_refused_at_submit():
    with pytest.raises(targets.TargetUnresolved, match="does not resolve") as caught:
        targets.check_url("http://gone.example/in", NO_RULES, Dns())
    assert caught.value.retryable
    with pytest.raises(
        InvalidInput, match=re.escape("'http://gone.example/in' has a host name that does not resolve now")
    ):
        check_notify_url(_settings(), STUDIO, "http://gone.example/in", resolver=Dns())
    with pytest.raises(targets.TargetRefused, match="not a valid name"):
        targets.check_url(f"http://{'a' * 64}.example/in", NO_RULES)  # no DNS asked: IDNA refuses the label


def test_submit_names_the_url_redacted_and_why_and_how_to_allow_it():
    url = "http://hooks:s3cretpw@127.0.0.1:9/in?token=t0psecret"
    with pytest.raises(InvalidInput) as caught:
        check_notify_url(_settings(), STUDIO, url)
    message = str(caught.value)
    assert message == (
        "the webhook URL 'http://hooks:***@127.0.0.1:9/in?token=***' resolves to a loopback address 127.0.0.1; "
        "allow it with MAS_WEBHOOK_ALLOWED_HOSTS; nothing was queued"
    )
    assert check_notify_url(_settings(webhook_allowed_hosts="127.0.0.1"), STUDIO, url) == url
    for bad in ("http://[::1/in", "http://127.0.0.1:99999/in", "ftp://93.184.216.34/in"):
        with pytest.raises(InvalidInput, match="not an http"):
            check_notify_url(_settings(), STUDIO, bad)
    assert check_notify_url(_settings(), STUDIO, f"https://{PUBLIC}/in") == f"https://{PUBLIC}/in"


def test_the_allowed_hosts_setting_is_comma_separated_names_and_networks(monkeypatch, tmp_path):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAS_WEBHOOK_ALLOWED_HOSTS", " Hooks.Example., 10.0.0.0/8 ,,[::1], 10.1.2.3/8 ")
    settings = Settings()
    assert settings.webhooks.allowed_hosts == ("hooks.example", "10.0.0.0/8", "::1", "10.1.2.3/8")
    assert settings.describe()["webhook_allowed_hosts"] == "hooks.example,10.0.0.0/8,::1,10.1.2.3/8"
    rules = targets.rules(settings, Dns())
    assert rules.allowed_names == {"hooks.example"} and len(rules.allowed_networks) == 3
    assert settings.changed(write_ahead=3).webhooks.allowed_hosts == settings.webhooks.allowed_hosts
    monkeypatch.setenv("MAS_WEBHOOK_ALLOWED_HOSTS", "")
    assert Settings().webhooks.allowed_hosts == ()
    for bad in ("hooks example", "http://hooks.example", "10.0.0.0/33", "*.example.com"):
        monkeypatch.setenv("MAS_WEBHOOK_ALLOWED_HOSTS", bad)
        with pytest.raises(ValidationError, match="MAS_WEBHOOK_ALLOWED_HOSTS"):
            Settings()
