"""Studies: a study file (:mod:`infra.study.spec`) run as configurations x load steps
(:mod:`infra.study.runner`); example study files in ``infra/study/examples/``.
"""
