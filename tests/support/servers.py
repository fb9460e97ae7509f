"""HTTP stand-ins the tests start in a thread of their own."""

import socketserver
import threading

# socketserver's serve_forever checks for shutdown() every poll_interval, 0.5 s by default, and shutdown() waits for
# that check (Python 3.11 docs, socketserver.BaseServer.serve_forever): every stand-in's teardown cost up to half a
# second, 8 s over tests/jobs/test_eks.py's 42 API servers.
POLL_SECONDS = 0.01


def serve_in_background(server: socketserver.BaseServer) -> threading.Thread:
    """server.serve_forever in a daemon thread; server.shutdown() then returns within POLL_SECONDS."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True
    )
    thread.start()
    return thread
