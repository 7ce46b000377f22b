"""The test helpers' port allocator: distinct, bindable, outside the kernel's ephemeral range."""

import socket

from harness import ports


def test_ports_are_distinct_bindable_and_not_ephemeral():
    low, high = ports._ephemeral_range()
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    for port in got[:20]:
        with socket.socket() as sock:
            sock.bind((ports.HOST, port))
    if low - ports._LOWEST >= 2000:
        assert all(ports._LOWEST <= p < low for p in got), (low, high)


def test_a_listening_port_is_never_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind((ports.HOST, ports.free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        ports._given.discard(port)
        real_choice = ports._random.choice
        draws = iter([port, port])
        monkeypatch.setattr(ports._random, "choice", lambda pool: next(draws, None) or real_choice(pool))
        assert ports.free_port() != port
