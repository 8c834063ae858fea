def main(argv=None):
    raise SystemExit("tirl: CLI not built yet")
