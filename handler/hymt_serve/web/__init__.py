"""The web front end (``hymt web``): the translation page and its API (:mod:`.app`), Chimera
refinement across two models (:mod:`.refine`), the LibreTranslate and DeepL compatible APIs
with the front end's own keys (:mod:`.compat`, :mod:`.deepl_documents`, :mod:`.keys`),
KServe's v2 API (:mod:`.oip_routes`) and OpenAI's chat and completion APIs
(:mod:`.openai_routes`).

A Starlette (ASGI) app served by uvicorn (:mod:`.serving`): every request and every relayed
stream is a coroutine on one event loop, and TorchServe is called with one
``aiohttp.ClientSession``. Nothing may block that loop: blocking work goes to
``anyio.to_thread.run_sync`` (a few worker threads, ``hymt web --threads``).

The pieces a route module uses (each route module is a function that returns its
``starlette.routing.Route`` list, which :func:`.app.create_app` adds; the app's ``state``
holds ``torchserve``, ``limits`` and ``client_keys``):

- who may call (:mod:`.access`): name the route; where keys are required ``KeyCheck`` has
  checked a bearer key before the route runs unless its name is in ``ALWAYS_OPEN`` or
  ``OWN_KEYS``; ``client_key(request)`` is that key (None on loopback), ``bearer_key(request,
  keys)`` checks one itself (for an ``OWN_KEYS`` route);
- quotas and fairness per key (:mod:`.access`, :mod:`.fairness`): ``with held(limits, key),
  counted(keys, key, characters) as outcome:`` (429 past ``--requests-per-key`` or the key's
  character limit; append the status to ``outcome``: anything but 200 gives the characters
  back);
- TorchServe (:mod:`.torchserve`): ``await torchserve.post(model, body)`` -> ``(status, JSON
  object)`` holding an upstream slot; ``await torchserve.stream(model, body)`` -> ``Streamed``
  (its ``lines()`` as they come; raises ``UpstreamFailed``, ``fairness.Busy``), sent with
  ``Relay(streamed, content, media_type)`` which closes it and frees its slot however the
  response ends (a client that goes away included); ``await torchserve.forward(model, body)``
  is the request API's whole proxy;
- bodies (:mod:`.bodies`): ``await json_object(request)``, ``await fields(request)``;
- errors: ``json_response(body, status)``; ``Busy`` and ``QuotaReached`` raised from a route
  become 503/429 JSON with ``Retry-After`` where due.
"""
