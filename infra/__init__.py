"""The Pulumi program for a trainstack environment: one ComponentResource per concern, composed in __main__.py.

`infra.config` and `trainer.contract.outputs` import neither pulumi nor pulumi_aws, so the trainer's tooling (plan, submit)
can read a stack's config and validate its outputs with only the training requirements installed.
"""
