"""Who acts and what they see, and the credentials as stored. Pure code: no server."""

from __future__ import annotations

import pytest

from mas.accounts import secrets as stored
from mas.domain.identity import ActsForOthers, Identity

ALICE = Identity(name="alice", role="member")
ROOT = Identity(name="root", role="admin")


def test_a_member_acts_only_for_themselves():
    assert ALICE.acts_for(None) == ALICE.acts_for("alice") == "alice"
    with pytest.raises(ActsForOthers, match="alice may act only for themselves"):
        ALICE.acts_for("bob")
    assert not ActsForOthers("x").retryable


def test_an_admin_acts_for_whoever_it_names():
    assert ROOT.acts_for(None) == "root" and ROOT.acts_for("bob") == "bob"


def test_a_member_sees_their_own_and_an_admin_everyones():
    assert ALICE.scope() == ALICE.scope("alice") == "alice"  # a member's own, whatever they name
    with pytest.raises(ActsForOthers):
        ALICE.scope("bob")
    assert ROOT.scope() is None and ROOT.scope("bob") == "bob"  # everyone's, or the user an admin names


def test_an_api_key_is_shown_once_and_kept_as_a_hash():
    key = stored.new_key()
    assert key.key.startswith("mas_" + key.key_id + "_") and key.secret_hash not in key.key
    key_id, secret = stored.split_key(key.key) or ("", "")
    assert key_id == key.key_id and stored.secret_matches(secret, key.secret_hash)
    assert not stored.secret_matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"), key.secret_hash)
    assert stored.new_key().key != key.key


@pytest.mark.parametrize("malformed", ["", "mas_", "Bearer x", "mas_0123456789ab_short", "mas_XYZ_" + "a" * 43])
def test_a_malformed_key_is_no_key(malformed):
    assert stored.split_key(malformed) is None


def test_a_password_is_kept_as_a_salted_scrypt_hash():
    first, second = stored.hash_password("correct horse battery"), stored.hash_password("correct horse battery")
    assert first != second and first.startswith("scrypt$") and "correct" not in first
    assert stored.password_matches("correct horse battery", first)
    assert not stored.password_matches("correct horse batter", first)
    for broken in ("", "scrypt$1$2", "md5$1$1$1$AAAA$AAAA", "scrypt$x$8$1$AAAA$AAAA"):
        assert not stored.password_matches("correct horse battery", broken)
