"""Serving a model version: `python -m trainer serve MODEL` (`make serve MODEL=<tag or version>`, docs/serving.md).

command  the `serve` verb: the version a tag or name gives, its export (made once where it is missing), and the
         server on this machine until SIGINT or SIGTERM
app      the OpenAI-compatible API: transformers' own `transformers serve` application for the one export,
         behind the request checks and the metrics
checks   what a generation request must be before it reaches the model: the served model's name, a well-formed
         body, and a prompt that fits the context with its new tokens
metrics  the server's Prometheus metrics (trainer/contract/metrics.py SERVING_METRICS) at /metrics
"""
