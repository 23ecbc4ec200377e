"""The fast path: every patch FedCure makes to Flower's, Starlette's and uvicorn's private code.

Outside this package FedCure imports Flower's public API only (``flwr.app``, ``flwr.serverapp``,
``flwr.clientapp``, ``flwr.common``; ``tests/test_flower_public_api.py`` scans for it). Every
patch here asks one gate first (:mod:`.gate`): the installed Flower must be inside FedCure's own
requirement on ``flwr`` (pyproject.toml, read back from the package metadata), and neither
``FEDCURE_FASTPATH=off`` nor ``FEDCURE_FASTPATH_OFF=<name>`` may turn it off. Each patch then
checks the code it replaces (the structural check below) and stays off, with a warning, where
that code changed. Off, Flower runs unchanged, at stock Flower's speed; ``fedcure launch``,
``fedcure-edge`` and ``fedcure-client`` say so in one warning line.

The patches (name for ``FEDCURE_FASTPATH_OFF``: module; what it replaces; why; the structural
check that turns it off; gain: the edge round with the patch off alone, the others on, against
all on, at the single-edge floor and the overhead at 32 clients, one idle run each: the table,
its spread and its command are in docs/benchmarks.md, "The fast path, patch by patch"):

- ``object_pulls`` (:mod:`.object_pulls`): wraps Flower's ``pull_objects`` /
  ``pull_and_inflate_object_from_tree`` as the SuperNode loop, the executor and the edge's grid
  imported them, with a 10 ms first retry doubling to 0.2 s instead of 1 s doubling to 10 s;
  every hop announces a message before its objects land. Check: the function still takes
  ``initial_backoff``, ``backoff_cap``, ``max_tries_per_object``, ``max_time``; a check that is
  complete whatever the version, so this patch alone also applies outside the range and with
  ``FEDCURE_FASTPATH=off`` (:data:`.gate.VERSION_FREE`; ``FEDCURE_FASTPATH_OFF=object_pulls``
  turns it off). Gain: floor +10 %, 32 clients −16 % (inside the spread).
- ``idle_clock`` (:mod:`.idle_clock`): replaces ``time`` in ``flwr.supernode.start_client_internal``
  (its hard-coded 3 s idle sleep and 0.5 s reply poll) and wraps its
  ``_pull_and_store_message``; with it, the SuperNode wakes the executor (:mod:`client.wake`).
  Check: the loop's source still holds ``time.sleep(3)``, ``time.sleep(0.5)``, the pull step
  and the idle branch. Gain: floor +540 %, 32 clients +62 %.
- ``held_pulls`` (:mod:`.held_pulls`): wraps the SuperLink's Fleet and Runtime
  ``pull_messages`` / ``push_messages`` / ``push_object`` handlers so an empty pull waits for a
  message and its objects, and widens the web server's worker pool (``create_app``); a waiting
  client then costs one request per hold instead of several a second. Check: each handler
  still exists with its parameter list. Gain: floor +12 %, 32 clients +35 %, and a waiting
  coalition of 32 takes 0.09 core instead of 0.71.
- ``object_batches`` (:mod:`.object_batches`, :mod:`.batch_routes`, :mod:`.fast_routes`): the
  SuperNode's, the executor's and the edge grid's HTTP clients pull and push a message's
  objects in one request; the SuperLink and the SuperNode serve the batch routes in front of
  Flower's HTTP stack (``create_app`` and ``PROTOBUF_REQUEST_TYPES``) through Flower's own
  signature, token and error checks. Check: the functions, methods and app factory it wraps
  exist; a server without the routes answers 404 and the callers go Flower's way. Gain: floor
  +25 %, 32 clients +32 %.
- ``message_batches`` (:mod:`.message_batches`, :mod:`.message_routes`): a message with its
  objects and its confirmation in one request each way (SuperNode), the edge's replies with
  theirs in one pull. Check: ``_push_messages`` still sends a reply then pushes its objects,
  the client classes have the methods it wraps; 404 falls back as above. Gain: floor +41 %, 32
  clients +175 %.
- ``task_batches`` (:mod:`.task_batches`): the executor takes a task and its input in one
  request from its SuperNode and returns reply and status in another, instead of eight.
  Check: as ``object_batches`` (the routes, their handlers, a 404 fallback). Gain: floor +8 %,
  32 clients +71 %.
- ``quiet_server`` (:mod:`.quiet_server`): replaces uvicorn's ``Server.main_loop`` (a wake-up
  every 0.1 s) by one that wakes every 5 s and at once on ``should_exit``. Check: the loop's
  source still waits with ``asyncio.sleep(0.1)`` and ``on_tick`` still refreshes per 10 ticks.
  Gain: floor +2 %, 32 clients +35 %, and a waiting coalition of 32 takes 0.09 core instead of
  0.70.
- ``buffered_middleware`` (:mod:`.buffered_middleware`): replaces Starlette's
  ``BaseHTTPMiddleware.__call__`` on Flower's Fleet and Runtime paths (inline, no task and
  memory streams per layer) and its ``run_in_threadpool`` for their in-memory handlers. Check:
  ``starlette.middleware.base._CachedRequest.wrapped_receive`` exists. Gain: floor −3 % (+11 %
  and +12 % in two more runs), 32 clients −13 %: the one patch whose gain is inside the spread
  at both sizes (measure it back to back before the next release drops or keeps it).
- ``lazy_sql`` (:mod:`.lazy_sql`): a stand-in for ``flwr.supercore.object_store.
  sql_object_store`` in ``sys.modules`` until something uses it, so a SuperNode does not load
  SQLAlchemy and Alembic (memory, not speed: 108 -> 79 MB idle). Check: the module is not
  imported yet.

:mod:`.roles` is what the roles call: the edge grid's patches, Flower's ``flower-superlink`` and
``flower-supernode`` mains run in a patched process, and the trainer's task identity.
"""
