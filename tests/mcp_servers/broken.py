"""MCP servers that misbehave, for the fault tests: `python broken.py MODE`.

hang     reads requests and never answers
garbage  answers every request with a line that is not JSON-RPC
exit     writes a reason to stderr and exits with status 3
"""

import sys

mode = sys.argv[1]
if mode == "exit":
    print("broken: cannot open database /nonexistent/db", file=sys.stderr, flush=True)
    sys.exit(3)
for _ in sys.stdin:
    if mode == "garbage":
        print("this is not json-rpc", flush=True)
