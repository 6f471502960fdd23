"""The HTTP gateway in front of Triton's HTTP port: clients reach Triton's HTTP API only through it.

Triton 2.51's HTTP front end crashes or holds resources on hostile input (docs/operations.md, "The HTTP
gateway"); the gateway refuses such input before Triton sees it: body size and JSON depth, connection
counts and timeouts, content types Triton's form parser would take. It also makes a client's going
away cancel a non-streaming generate, and answers `/livez` and `/readyz` from a probe of Triton's repository.
`python -m ragstack.gateway` runs it; the launcher starts one with each server.
"""
