"""What the three systems (serving, training, search) each wrote once and now share: small leaf
modules that import nothing of sluice but other leaves (tests/unit/test_layering.py).

    api_keys.py        the API key a request presents (one header precedence) and its check
    s3.py              s3:// URLs and the boto3 client (endpoint, region, credentials, retries)
    backoff.py         restart back-off for supervised child processes
    uvicorn_protocol.py  the one import of uvicorn's private httptools protocol, with its check
    fault_spec.py      the parser of the testing aids' fault specs (worker and training)
"""
