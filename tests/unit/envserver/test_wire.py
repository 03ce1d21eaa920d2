"""Our EnvServer client: delta assembly, version refusal, and the request/reply frames
against a real ZMQ ROUTER socket playing a server."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from rlvr.envserver.wire import (
    Assembly,
    EnvServerClient,
    EnvServerError,
    EpisodeDeadline,
    UnknownServerError,
    pack,
    unpack,
)

HEADER = {"version": 1, "id": "t1", "verifiers": {"version": "0.4.0"}, "task": {}}


def opened(**extra) -> dict:
    return {"trace": "t1", "open": HEADER, **extra}


def test_deltas_append_nodes_set_scalars_and_link_earlier_nodes() -> None:
    assembly = Assembly()
    assembly.apply(opened(nodes=[{"parent": None, "semantic_parents": []}], pending=[{"m": 1}]))
    assembly.apply({"trace": "t1", "nodes": [{"parent": 0}], "calls": [{"node": 1}]})
    assembly.apply({"trace": "t1", "links": {0: [{"type": "x"}]}, "set": {"ok": True}})
    episode = assembly.finish({"ok": True}, [{"id": "t1", "nodes": 2, "calls": 1}])
    (trace,) = episode["traces"]
    assert [n["parent"] for n in trace["nodes"]] == [None, 0]
    assert trace["nodes"][0]["semantic_parents"] == [{"type": "x"}]
    assert trace["ok"] is True and "pending" not in trace
    assert episode["ok"] is True


def test_a_discarded_trace_is_dropped_and_a_lost_delta_fails_loudly() -> None:
    assembly = Assembly()
    assembly.apply(opened(nodes=[{"parent": None}]))
    assembly.apply({"trace": "t1", "discard": True})
    with pytest.raises(EnvServerError, match="missing trace t1"):
        assembly.finish({}, [{"id": "t1", "nodes": 1, "calls": 0}])
    assembly.apply(opened(nodes=[{"parent": None}]))
    with pytest.raises(EnvServerError, match="assembled 1 nodes / 0 calls, the server reports 2"):
        assembly.finish({}, [{"id": "t1", "nodes": 2, "calls": 0}])


@pytest.mark.parametrize(
    "header",
    [{**HEADER, "version": 2}, {**HEADER, "verifiers": {"version": "0.5.0"}}, {"id": "t1"}],
)
def test_an_unknown_trace_format_or_verifiers_release_is_refused(header) -> None:
    with pytest.raises(UnknownServerError, match="this trainer reads format"):
        Assembly().apply({"trace": "t1", "open": header})


async def serve(router: zmq.asyncio.Socket, handle) -> None:
    """A stand-in server: answers each request by `handle(method, payload)` -> frames."""
    while True:
        client, request_id, method, payload = await router.recv_multipart()
        for kind, data in await handle(method.decode(), unpack(payload)):
            await router.send_multipart([client, request_id, kind, pack(data)])


def run_against(handle, body) -> None:
    async def main():
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        server = asyncio.create_task(serve(router, handle))
        client = EnvServerClient(f"tcp://127.0.0.1:{port}")
        try:
            await body(client)
        finally:
            server.cancel()
            client.close()
            router.close(linger=0)
            ctx.term()

    asyncio.run(main())


def test_a_run_streams_deltas_then_replies_with_the_head() -> None:
    async def handle(method, payload):
        assert method == "run" and payload["task_data"] == {"text": "abc"}
        return [
            (b"delta", opened(nodes=[{"parent": None, "token_ids": [1]}])),
            (
                b"reply",
                {
                    "success": True,
                    "head": {"ok": True},
                    "traces": [{"id": "t1", "nodes": 1, "calls": 0}],
                },
            ),
        ]

    async def body(client):
        assert await client.health(timeout=0.5) is False  # handle() refuses health: no reply
        episode = await client.run({"task_data": {"text": "abc"}})
        assert episode["ok"] and episode["traces"][0]["nodes"][0]["token_ids"] == [1]

    async def handle_or_ignore(method, payload):
        return [] if method == "health" else await handle(method, payload)

    run_against(handle_or_ignore, body)


def test_a_failed_reply_raises_its_error() -> None:
    async def handle(method, payload):
        return [(b"reply", {"success": False, "error": "ValidationError: text missing"})]

    async def body(client):
        with pytest.raises(EnvServerError, match="text missing"):
            await client.run({"task_data": {}})

    run_against(handle, body)


def test_a_deadline_cancels_the_run_on_the_server() -> None:
    cancelled: list[str] = []

    async def handle(method, payload):
        if method == "cancel":
            cancelled.append(payload["request_id"])
            return [(b"reply", {"success": True, "cancelled": True})]
        return []  # a run that never ends

    async def body(client):
        with pytest.raises(EpisodeDeadline, match="0.2 s deadline"):
            await client.run({"task_data": {}}, deadline_s=0.2)
        assert len(cancelled) == 1 and len(cancelled[0]) == 32

    run_against(handle, body)


def test_a_bad_frame_fails_its_request_only_and_the_loop_goes_on() -> None:
    """A frame whose request id is not UTF-8 and one of two parts are dropped; a reply that
    is not msgpack fails its own request with a clear error; the client goes on answering
    the requests after them (before, the first one ended its receive loop for good)."""

    async def main():
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        client = EnvServerClient(f"tcp://127.0.0.1:{port}")
        ok = pack({"success": True})

        async def answer(frames_for) -> None:
            """Answer the next request with the frames `frames_for(its request id)`."""
            peer, request_id, _, _ = await router.recv_multipart()
            for frames in frames_for(request_id):
                await router.send_multipart([peer, *frames])

        try:
            asking = asyncio.ensure_future(client.health(timeout=5))
            await answer(
                lambda rid: [[b"\xff\xfe", b"reply", ok], [rid, b"reply"], [rid, b"reply", ok]]
            )
            assert await asking
            asking = asyncio.ensure_future(client.cancel("run-1", timeout=5))
            await answer(lambda rid: [[rid, b"reply", b"\xc1"]])
            with pytest.raises(EnvServerError, match="cancel: the server's reply cannot be read"):
                await asking
            asking = asyncio.ensure_future(client.health(timeout=5))
            await answer(lambda rid: [[rid, b"reply", ok]])
            assert await asking
        finally:
            client.close()
            router.close(linger=0)
            ctx.term()

    asyncio.run(main())
