"""`make deploy STACK=<env> MODEL=<tag>`: a model version's export onto the stack's SageMaker endpoint, behind a
canary, rolled back by alarms (docs/serving-stack.md).

readiness  what a version needs before it may go live: an evaluation with its smoke answer and a complete export
endpoint   the SageMaker requests (Model, EndpointConfig, the blue/green DeploymentConfig), the rollout followed to
           its end with the smoke check, the variant's autoscaling, and where and when each version went live
gate       whether a fine-tune's new version beats the live one by the suite's margin (`make finetune DEPLOY=1`)
command    `python -m trainer deploy`: refuse, do nothing, deploy or roll back, and report
"""
