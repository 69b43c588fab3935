"""Where the RL stages run: ``local`` (processes on this machine) or ``ray`` (actors)."""
