"""The warm worker's code, which runs inside the sandbox: standard library only, never imports tirl.

zygote.py is the entry point (started as a script); wire.py is the protocol the host (local.py) shares with it;
script.py runs one snippet in the forked child; runfiles.py writes, fetches and wipes a run's files. Only this
directory of tirl is visible inside a bwrap sandbox.
"""
