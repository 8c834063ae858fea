"""The warm worker's code, which runs inside the sandbox: standard library only, never imports tirl.

zygote.py is the entry point (started as a script); wire.py is the protocol the host (local.py) shares with it;
child.py sets up the forked child and script.py runs one snippet in it; supervise.py reads its output and kills and
reaps its processes; runfiles.py writes, fetches and wipes a run's files; privileges.py keeps a snippet from the
worker. Only this directory of tirl is visible inside a bwrap sandbox.
"""
