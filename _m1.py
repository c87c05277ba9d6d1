import numpy as np, time
from fl_core import load_federated, PlainAggregation
from fl_core.standardize import federated_moments, apply_standardization
from fl_core.mocha import Mocha, MochaClient
rng=np.random.default_rng(0)
data=load_federated("synthetic", n_clients=10, rng=rng, synthetic_setup=4, synthetic_samples=2000)
m,s,_=federated_moments(data, PlainAggregation()); data=apply_standardization(data,m,s)
def split(c, rng, f=0.25):
    idx=rng.permutation(len(c)); k=max(1,int(round(f*len(c))))
    return (c.x[idx[k:]],c.y[idx[k:]]),(c.x[idx[:k]],c.y[idx[:k]])
parts=[split(c,rng) for c in data.clients]
for lam in (1e-3,1e-2):
 for oe,name in ((0,"local"),(5,"mocha"),(1,"mocha1")):
  cl=[MochaClient(client_id=t,x=tr[0],y=tr[1]) for t,(tr,te) in enumerate(parts)]
  t0=time.time()
  res=Mocha(loss="logistic",lam=lam,local_steps=100,omega_every=oe).fit(cl,rounds=40,rng=rng)
  acc=[c.accuracy(res.w[:,t],*te) for t,(c,(tr,te)) in enumerate(zip(cl,parts))]
  print(lam,name,round(time.time()-t0,2),"gap",[f"{r.gap:.1e}" for r in res.rounds[::8]],"acc",np.mean(acc).round(4))
