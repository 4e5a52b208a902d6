"""The Tinker API's JSON bodies, mirroring tinker 0.38.0: one module per resource, as `tx/api/routes/` is.

`base.py` holds what every body shares (unknown keys ignored, text checked for valid Unicode, caps on
metadata and tags); `asample.py` the asample body and the JSON forms of ModelInput and TensorData;
`oai.py` the OpenAI-compatible bodies. These are wire objects only: `tx/api/wire/convert.py` turns them
into domain types. Imports: pydantic and `tx.types` only.
"""
