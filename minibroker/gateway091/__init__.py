"""The AMQP 0-9-1 gateway (issue 18): 0-9-1 connections served through an in-process AMQP 1.0 connection to the
broker core; ``convert`` maps messages between the two protocols as RabbitMQ 4 does."""
