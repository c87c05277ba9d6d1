import itertools, random, time
from protocols.masked import client as cl
from tests.protocols.adversary import make_world, prepare, finish, Strategy
from tests.protocols.test_searching_adversary import subsets
def search(n, k, active, tries=60, seed=0, corrupt=frozenset({2})):
    rnd = random.Random(seed)
    world = make_world(n, k, active=active, corrupt=corrupt)
    t = world.threshold; N = world.graph.neighbours(1)
    found = 0; leaves = 0
    for P in subsets(N, (t,)):
        world = make_world(n, k, active=active, corrupt=corrupt)
        prep = prepare(world, Strategy(forward={1: P}))
        everyone = tuple(sorted(prep.masked))
        for gone in subsets(P | {1}, (1, 2, 3)):
            lists = (everyone, tuple(c for c in everyone if c not in gone))
            for _ in range(tries):
                shown = {c: rnd.randint(0, 1) for c in world.honest}
                o = finish(prep, lists, shown); leaves += 1
                if o.broken: found += 1
    return found, leaves, t
t0=time.time()
print("real active", search(10, 6, True, tries=10), time.time()-t0)
print("semi", search(10, 6, False, tries=10))
orig = cl._AwaitUnmask._check_attestations
cl._AwaitUnmask._check_attestations = lambda self, *a: None
print("no attestation", search(10, 6, True, tries=10))
cl._AwaitUnmask._check_attestations = orig
cl.survivor_quorum = lambda n, c: 1
print("quorum 1", search(10, 6, True, tries=10))
cl._AwaitUnmask._check_attestations = lambda self, *a: None
print("both", search(10, 6, True, tries=10))
