"""Serving a model version: `python -m trainer serve MODEL` (`make serve MODEL=<tag or version>`, docs/serving.md).

command  the `serve` verb: the version a tag or name gives, its export (made once where it is missing), and the
         server on this machine until SIGINT or SIGTERM
app      the OpenAI-compatible API over the one export, answering as vLLM's server does, behind the metrics
protocol the request bodies field for field as vLLM's (honoured, or refused with a 400)
checks   what a generation request must be before it reaches the model: the served model's name, its fields,
         token ids inside the vocabulary, and a prompt that fits the context with its new tokens
engine   the export under transformers: prompts (the one BOS rule), decoding token by token, stops
sampling one step's choice of token, as vLLM's sampler makes it
metrics  the server's Prometheus metrics (trainer/contract/metrics.py SERVING_METRICS) at /metrics
"""
