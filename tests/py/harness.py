"""What the Python tests share: the PASS/FAIL/SKIP line protocol that tests/run.sh counts,
and where the build put the C tools."""
import os

BUILD = os.environ.get("GLM_BUILD", "build")


def tool(name):
    """Path of a test tool built from tests/c/tool_NAME.c."""
    return os.path.join(BUILD, "tests", name)


class Checks:
    """Prints one PASS/FAIL/SKIP line per check and remembers whether any failed."""

    def __init__(self):
        self.fails = 0

    def check(self, name, cond, why=""):
        if cond:
            print(f"PASS {name}")
        else:
            self.fails += 1
            print(f"FAIL {name}: {why}")
        return cond

    def report(self, name, cond, detail):
        """check() with a detail printed either way: the measurement beside a PASS, the why of a FAIL."""
        print(("PASS %s (%s)" if cond else "FAIL %s: %s") % (name, detail), flush=True)
        self.fails += not cond
        return cond

    def skip(self, name, why):
        print(f"SKIP {name}: {why}")

    def status(self):
        """The exit status: 1 when a check failed."""
        return 1 if self.fails else 0
