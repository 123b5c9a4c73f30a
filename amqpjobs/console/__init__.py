"""``amqpjobs console``: a web page over quarantine and replay (the optional extra ``amqpjobs[console]``).

A face like :mod:`amqpjobs.cli`: every figure and every action is the library's
(:mod:`amqpjobs.runtime.status`, :mod:`amqpjobs.runtime.quarantine`, :mod:`amqpjobs.runtime.replay`
with its canary and the mover lock, :mod:`amqpjobs.runtime.parking`), so the page and the CLI
cannot disagree, and a replay started here refuses to run beside one started there. Pages are
rendered on the server (Starlette + Jinja2, autoescaped); a small script of our own
(``static/console.js``, no build step, no CDN) refreshes them and follows an action's progress.
"""
