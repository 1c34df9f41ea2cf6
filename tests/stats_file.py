# The plugin's stats= file as the Python parts of the tests read it:
#
#   sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
#   from stats_file import next_stat
import os
import time


def next_stat(path, name):
    """Field name (an int) of the next stats file the housekeeper writes
    at path: the file is removed, then awaited (it comes every second)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    for _ in range(50):
        try:
            for line in open(path):
                key, _, value = line.partition(": ")
                if key == name:
                    return int(value)
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    raise AssertionError("no %s in %s" % (name, path))
